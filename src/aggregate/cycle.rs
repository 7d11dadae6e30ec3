//! Aggregates and their streams as a graph, and the cycles it must not have.
//!
//! A windowed aggregate reads one stream and appends its closed windows to
//! another (its `output`): an edge `stream -> output`. A cycle in that graph
//! (`in -> out -> in`) makes the engine feed its own output back to itself:
//! one event closes a window, which is an event on the next stream, which
//! closes a window there, and so on for ever (with hopping windows each
//! event closes several windows, so the streams grow exponentially). A
//! declaration whose output is its own input is refused by
//! [`crate::aggregate::AggregateDeclaration::from_value`]; one that would close
//! a longer cycle with the aggregates already declared is refused by the
//! admin side with [`cycle_closed_by`], which names the cycle.
//!
//! A catalog written before cycles were refused may hold one. At start
//! [`cycles_in`] finds, in declaration order, each declaration that closes a
//! cycle with those before it (exactly the ones a declaration today would be
//! refused for): the engine keeps them in the catalog but does not run them
//! (`crate::stream::Catalog::suspend_cycles`).

use std::collections::VecDeque;
use std::fmt;

use crate::aggregate::AggregateDeclaration;

/// A cycle of streams through aggregates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The streams around the cycle, the first repeated at the end
    /// (`["in", "out", "in"]`).
    pub streams: Vec<String>,
    /// The aggregate of each step: `streams[i] -> streams[i + 1]` is
    /// `aggregates[i]`.
    pub aggregates: Vec<String>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cycle: {} (aggregates {})", self.streams.join(" -> "), self.aggregates.join(", "))
    }
}

/// The cycle `declaration` would close with the aggregates `declared`, if
/// any: a path from its output back to its stream. The cycle starts at the
/// output (`in -> out -> in` for `out -> in` declared after `in -> out`).
/// Breadth first, so the cycle named is a shortest one.
pub fn cycle_closed_by(declared: &[AggregateDeclaration], declaration: &AggregateDeclaration) -> Option<Cycle> {
    let output = declaration.output.as_deref()?;
    let stream = declaration.stream.as_str();
    // The edge (index into `declared`) each stream was first reached by.
    let mut reached_by: Vec<(&str, Option<usize>)> = vec![(output, None)];
    let mut queue = VecDeque::from([output]);
    while let Some(at) = queue.pop_front() {
        if at == stream {
            return Some(path_to(declared, &reached_by, stream, declaration));
        }
        for (index, edge) in declared.iter().enumerate() {
            let Some(next) = edge.output.as_deref() else { continue };
            if edge.stream == at && !reached_by.iter().any(|(seen, _)| *seen == next) {
                reached_by.push((next, Some(index)));
                queue.push_back(next);
            }
        }
    }
    None
}

/// The cycle from `declaration`'s output to `stream` along the edges that
/// first reached each stream, closed by `declaration` itself.
fn path_to(
    declared: &[AggregateDeclaration],
    reached_by: &[(&str, Option<usize>)],
    stream: &str,
    declaration: &AggregateDeclaration,
) -> Cycle {
    let mut streams = vec![stream.to_string()];
    let mut aggregates = Vec::new();
    let mut at = stream;
    while let Some(&(_, Some(index))) = reached_by.iter().find(|(seen, _)| *seen == at) {
        aggregates.push(declared[index].name.clone());
        at = declared[index].stream.as_str();
        streams.push(at.to_string());
    }
    streams.reverse();
    aggregates.reverse();
    streams.push(streams[0].clone());
    aggregates.push(declaration.name.clone());
    Cycle { streams, aggregates }
}

/// Each declaration, in order, that closes a cycle with the ones before it
/// that do not: what a catalog from before cycles were refused holds that
/// a declaration today would be refused for. The others form no cycle.
pub fn cycles_in(declarations: &[AggregateDeclaration]) -> Vec<(usize, Cycle)> {
    let mut acyclic: Vec<AggregateDeclaration> = Vec::new();
    let mut closing = Vec::new();
    for (index, declaration) in declarations.iter().enumerate() {
        match cycle_closed_by(&acyclic, declaration) {
            Some(cycle) => closing.push((index, cycle)),
            None => acyclic.push(declaration.clone()),
        }
    }
    closing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(name: &str, stream: &str, output: &str) -> AggregateDeclaration {
        let body = format!(
            r#"{{"name":"{name}","stream":"{stream}","kind":"count","window":{{"type":"tumbling","size_ms":500}},
               "output":"{output}"}}"#
        );
        AggregateDeclaration::from_json(body.as_bytes()).unwrap()
    }

    fn running(name: &str, stream: &str) -> AggregateDeclaration {
        let body = format!(r#"{{"name":"{name}","stream":"{stream}","kind":"count","window":{{"type":"none"}}}}"#);
        AggregateDeclaration::from_json(body.as_bytes()).unwrap()
    }

    /// Two aggregates feeding each other are a cycle, named from the new
    /// one's output with every aggregate on the way.
    #[test]
    fn a_two_stream_cycle_is_found_and_named() {
        let declared = [count("fwd", "in", "out")];
        let cycle = cycle_closed_by(&declared, &count("back", "out", "in")).unwrap();
        assert_eq!(cycle.streams, ["in", "out", "in"]);
        assert_eq!(cycle.aggregates, ["fwd", "back"]);
        assert_eq!(cycle.to_string(), "cycle: in -> out -> in (aggregates fwd, back)");
    }

    /// A longer cycle is found through branches and dead ends; chains,
    /// diamonds and running aggregates (no output) are not cycles.
    #[test]
    fn longer_cycles_are_found_and_chains_are_not() {
        let declared = [
            count("ab", "a", "b"),
            count("bx", "b", "x"),
            count("bc", "b", "c"),
            count("ad", "a", "d"),
            count("dc", "d", "c"),
            running("total", "c"),
        ];
        let cycle = cycle_closed_by(&declared, &count("ca", "c", "a")).unwrap();
        assert_eq!(cycle.to_string(), "cycle: a -> b -> c -> a (aggregates ab, bc, ca)");
        assert_eq!(cycle_closed_by(&declared, &count("cz", "c", "z")), None, "a chain");
        assert_eq!(cycle_closed_by(&declared, &count("xd", "x", "d")), None, "a diamond, no way back");
        assert_eq!(cycle_closed_by(&declared, &running("r", "c")), None, "no output, no edge");
        let parallel = cycle_closed_by(&[count("one", "p", "q"), count("two", "p", "q")], &count("back", "q", "p"));
        assert_eq!(parallel.unwrap().aggregates, ["one", "back"]);
    }

    /// In a catalog with cycles, each declaration that closes one with the
    /// earlier ones is found (in order), and the rest are acyclic.
    #[test]
    fn a_catalog_with_cycles_names_the_declarations_that_close_them() {
        let declarations = [
            count("fwd", "in", "out"),
            count("back", "out", "in"),
            count("chain", "out", "side"),
            count("xy", "x", "y"),
            count("yz", "y", "z"),
            count("zx", "z", "x"),
            count("back2", "out", "in"),
        ];
        let found: Vec<(usize, String)> =
            cycles_in(&declarations).into_iter().map(|(index, cycle)| (index, cycle.to_string())).collect();
        assert_eq!(
            found,
            [
                (1, "cycle: in -> out -> in (aggregates fwd, back)".to_string()),
                (5, "cycle: x -> y -> z -> x (aggregates xy, yz, zx)".to_string()),
                (6, "cycle: in -> out -> in (aggregates fwd, back2)".to_string()),
            ]
        );
        assert!(cycles_in(&declarations[2..5]).is_empty());
    }
}
