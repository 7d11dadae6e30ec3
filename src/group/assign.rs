//! Balanced, sticky assignment of a stream's partitions to a group's members.
//!
//! Balanced: members' partition counts differ by at most one. Sticky: a
//! member keeps what it holds up to its quota, so a join or a leave moves
//! only the partitions it must. On a join the new member takes at most
//! `ceil(P / members)` partitions, each from a member over its new quota; on
//! a leave only the leaver's partitions move. Counts, not load: every member
//! gets a fair share of partitions whatever their rates (a member's work is
//! bounded by its share; load-weighted assignment is left for later, see the
//! README).

/// The assignment that keeps `current` as far as balance allows.
/// `current[p]` is the index of the member holding partition `p` (members
/// are `0..member_count`, in join order), `None` if nobody does. Members
/// that already hold the most get the `P % members` larger quotas, so fewer
/// partitions move; ties go to the earlier member. Deterministic.
pub fn balance(current: &[Option<usize>], member_count: usize) -> Vec<Option<usize>> {
    let partition_count = current.len();
    if member_count == 0 {
        return vec![None; partition_count];
    }
    let mut counts = vec![0usize; member_count];
    for member in current.iter().flatten() {
        counts[*member] += 1;
    }
    let base = partition_count / member_count;
    let extra = partition_count % member_count;
    let mut by_holdings: Vec<usize> = (0..member_count).collect();
    by_holdings.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
    let mut quota = vec![base; member_count];
    for &member in by_holdings.iter().take(extra) {
        quota[member] += 1;
    }
    let mut desired: Vec<Option<usize>> = current.to_vec();
    let mut kept = vec![0usize; member_count];
    for slot in desired.iter_mut() {
        if let Some(member) = *slot {
            if member >= member_count || kept[member] == quota[member] {
                *slot = None;
            } else {
                kept[member] += 1;
            }
        }
    }
    let mut member = 0;
    for slot in desired.iter_mut().filter(|slot| slot.is_none()) {
        while kept[member] == quota[member] {
            member += 1;
        }
        *slot = Some(member);
        kept[member] += 1;
    }
    desired
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counts(assignment: &[Option<usize>], members: usize) -> Vec<usize> {
        let mut counts = vec![0; members];
        for member in assignment.iter().flatten() {
            counts[*member] += 1;
        }
        counts
    }

    #[test]
    fn first_member_takes_everything_then_a_join_moves_a_fair_share() {
        let one = balance(&[None; 8], 1);
        assert_eq!(one, vec![Some(0); 8]);
        let two = balance(&one, 2);
        assert_eq!(counts(&two, 2), [4, 4]);
        let moved = one.iter().zip(&two).filter(|(a, b)| a != b).count();
        assert_eq!(moved, 4);
    }

    #[test]
    fn a_leave_moves_only_the_leavers_partitions() {
        let three = balance(&balance(&balance(&[None; 9], 1), 2), 3);
        assert_eq!(counts(&three, 3), [3, 3, 3]);
        // Member 1 leaves: indices above it shift down by one.
        let after: Vec<Option<usize>> = three
            .iter()
            .map(|slot| match slot {
                Some(1) => None,
                Some(2) => Some(1),
                other => *other,
            })
            .collect();
        let two = balance(&after, 2);
        assert_eq!(counts(&two, 2).iter().max().unwrap() - counts(&two, 2).iter().min().unwrap(), 1);
        for (before, now) in after.iter().zip(&two) {
            if before.is_some() {
                assert_eq!(before, now, "a survivor's partition never moves on a leave");
            }
        }
    }

    proptest! {
        /// Balanced within one, complete, and a join moves at most
        /// ceil(P / members) partitions.
        #[test]
        fn balanced_complete_and_sticky(partitions in 1usize..200, members in 1usize..20, seed in any::<u64>()) {
            let mut state = seed;
            let mut next = || { state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); state >> 33 };
            let current: Vec<Option<usize>> = (0..partitions)
                .map(|_| if next() % 4 == 0 { None } else { Some((next() as usize) % members) })
                .collect();
            let desired = balance(&current, members);
            let counts = counts(&desired, members);
            prop_assert!(desired.iter().all(Option::is_some));
            prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
            // Join: one more member, starting from a balanced state.
            let joined = balance(&desired, members + 1);
            let moved = desired.iter().zip(&joined).filter(|(a, b)| a != b).count();
            prop_assert!(moved <= partitions.div_ceil(members + 1), "moved {} of {}", moved, partitions);
        }
    }
}
