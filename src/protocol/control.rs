//! The rest of an ingest conversation: control lines a producer sends and the
//! replies it gets.
//!
//! * Control lines start with `#` (the line parser hands over the text after
//!   it): `#SYNC [token]` and `#PING [token]`. The token is echoed back, so it
//!   is bounded: one longer than [`CONTROL_TOKEN_SIZE_MAX`] bytes gets
//!   `ERR <line-number> token_too_long: ...` instead of an `OK`.
//! * Replies, one line each: `OK <line-number> <COMMAND> [token]` and
//!   `ERR <line-number> <reason>: <detail>`. Line numbers count every line of
//!   the connection from 1, so a producer can map a reply to its input.
//!
//! Both sides are here: [`parse_control`] and the reply writers for the
//! server, [`parse_reply`] for clients (`spate pub`, the tests, the bench).

pub use crate::config::limits::CONTROL_TOKEN_SIZE_MAX;

/// A control line, borrowing from the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control<'a> {
    /// `#SYNC [token]`: answer once the connection's earlier events are stored.
    Sync { token: &'a [u8] },
    /// `#PING [token]`: answer at once.
    Ping { token: &'a [u8] },
    /// `#STREAM name`: the lines after it go to stream `name`.
    Stream { name: &'a [u8] },
    /// Anything else: the command word, for the error reply.
    Unknown { command: &'a [u8] },
    /// A known command whose token is longer than [`CONTROL_TOKEN_SIZE_MAX`].
    TokenTooLong(TokenTooLong<'a>),
}

/// The control commands a server knows, for the `unknown_control` reply.
pub const CONTROL_COMMANDS: &str = "#SYNC, #PING, #STREAM";

/// Parses the text of a control line (after its `#`).
pub fn parse_control(text: &[u8]) -> Control<'_> {
    let (command, argument) = match memchr::memchr(b' ', text) {
        Some(space) => (&text[..space], &text[space + 1..]),
        None => (text, &text[text.len()..]),
    };
    let known = matches!(command, b"SYNC" | b"PING");
    if known && argument.len() > CONTROL_TOKEN_SIZE_MAX {
        return Control::TokenTooLong(TokenTooLong { command, token_size: argument.len() });
    }
    match command {
        b"SYNC" => Control::Sync { token: argument },
        b"PING" => Control::Ping { token: argument },
        b"STREAM" => Control::Stream { name: argument },
        _ => Control::Unknown { command },
    }
}

/// The `token_too_long` error: a `#SYNC`/`#PING` token over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenTooLong<'a> {
    /// `SYNC` or `PING`.
    pub command: &'a [u8],
    pub token_size: usize,
}

impl std::fmt::Display for TokenTooLong<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "token_too_long: #{} token is {} bytes, limit {CONTROL_TOKEN_SIZE_MAX}",
            String::from_utf8_lossy(self.command),
            self.token_size
        )
    }
}

/// Appends `OK <line-number> <command>[ <token>]\n`.
pub fn write_ok(out: &mut Vec<u8>, line_number: u64, command: &[u8], token: &[u8]) {
    out.extend_from_slice(b"OK ");
    out.extend_from_slice(itoa::Buffer::new().format(line_number).as_bytes());
    out.push(b' ');
    out.extend_from_slice(command);
    if !token.is_empty() {
        out.push(b' ');
        out.extend_from_slice(token);
    }
    out.push(b'\n');
}

/// Appends `ERR <line-number> <error>\n`, where the error's Display text is
/// `<reason>: <detail>`.
pub fn write_err(out: &mut Vec<u8>, line_number: u64, error: impl std::fmt::Display) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = writeln!(out, "ERR {line_number} {error}");
}

/// The `unknown_control` error, with the command shown (at most 32 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownControl {
    pub command_shown: String,
}

impl UnknownControl {
    pub fn new(command: &[u8]) -> UnknownControl {
        UnknownControl { command_shown: String::from_utf8_lossy(&command[..command.len().min(32)]).into_owned() }
    }
}

impl std::fmt::Display for UnknownControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown_control: #{} (known: {CONTROL_COMMANDS})", self.command_shown)
    }
}

/// A reply line as a client reads it (without LF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    Ok { line_number: u64, command: &'a [u8], token: &'a [u8] },
    Err { line_number: u64, reason: &'a [u8], detail: &'a [u8] },
}

/// Parses a reply line; `None` if it is neither `OK` nor `ERR` as above.
pub fn parse_reply(line: &[u8]) -> Option<Reply<'_>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (kind, rest) = split_word(line);
    let (number, rest) = split_word(rest?);
    let line_number = std::str::from_utf8(number).ok()?.parse().ok()?;
    match kind {
        b"OK" => {
            let (command, token) = split_word(rest?);
            Some(Reply::Ok { line_number, command, token: token.unwrap_or(b"") })
        }
        b"ERR" => {
            let rest = rest?;
            let (reason, detail) = match memchr::memmem::find(rest, b": ") {
                Some(colon) => (&rest[..colon], &rest[colon + 2..]),
                None => (rest, &rest[rest.len()..]),
            };
            Some(Reply::Err { line_number, reason, detail })
        }
        _ => None,
    }
}

/// Splits off the first space-separated word; the rest is `None` when there
/// was no space.
fn split_word(text: &[u8]) -> (&[u8], Option<&[u8]>) {
    match memchr::memchr(b' ', text) {
        Some(space) => (&text[..space], Some(&text[space + 1..])),
        None => (text, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::LineError;
    use proptest::strategy::Strategy;

    /// Control lines parse into their command and token, unknown ones keep the word.
    #[test]
    fn control_lines_parse() {
        assert_eq!(parse_control(b"SYNC"), Control::Sync { token: b"" });
        assert_eq!(parse_control(b"SYNC t 1"), Control::Sync { token: b"t 1" });
        assert_eq!(parse_control(b"PING x"), Control::Ping { token: b"x" });
        assert_eq!(parse_control(b"STREAM clicks"), Control::Stream { name: b"clicks" });
        assert_eq!(parse_control(b"sync"), Control::Unknown { command: b"sync" });
        assert_eq!(parse_control(b""), Control::Unknown { command: b"" });
        let long = [b"PING ".as_slice(), &[b'x'; CONTROL_TOKEN_SIZE_MAX + 1]].concat();
        let Control::TokenTooLong(error) = parse_control(&long) else { panic!("a long token is refused") };
        assert_eq!(error.token_size, CONTROL_TOKEN_SIZE_MAX + 1);
        assert!(error.to_string().starts_with("token_too_long: #PING token is 257 bytes, limit 256"), "{error}");
    }

    proptest::proptest! {
        /// Any control text parses without panicking; a known command's token
        /// is echoed exactly when it fits the limit and refused when it does
        /// not; and the `OK` reply for an accepted token parses back to it.
        #[test]
        fn control_tokens_are_bounded(
            command in proptest::prop_oneof![
                proptest::strategy::Just(b"SYNC".to_vec()),
                proptest::strategy::Just(b"PING".to_vec()),
                proptest::collection::vec(
                    proptest::prelude::any::<u8>().prop_filter("one word", |byte| *byte != b' '),
                    0..8,
                ),
            ],
            token in proptest::collection::vec(
                proptest::prelude::any::<u8>().prop_filter("no LF in a line", |byte| *byte != b'\n'),
                0..CONTROL_TOKEN_SIZE_MAX * 2,
            ),
        ) {
            let text = [command.as_slice(), b" ", &token].concat();
            let known = command == b"SYNC" || command == b"PING";
            let fits = token.len() <= CONTROL_TOKEN_SIZE_MAX;
            match parse_control(&text) {
                Control::Sync { token: parsed } | Control::Ping { token: parsed } => {
                    proptest::prop_assert!(known && fits);
                    proptest::prop_assert_eq!(parsed, token.as_slice());
                    let mut reply = Vec::new();
                    write_ok(&mut reply, 7, &command, parsed);
                    proptest::prop_assert!(reply.len() <= 32 + CONTROL_TOKEN_SIZE_MAX);
                    let parsed_reply = parse_reply(&reply[..reply.len() - 1]);
                    let expected_token: &[u8] = if token.is_empty() { b"" } else { &token };
                    if !token.ends_with(b"\r") {
                        proptest::prop_assert_eq!(
                            parsed_reply,
                            Some(Reply::Ok { line_number: 7, command: &command, token: expected_token })
                        );
                    }
                }
                Control::TokenTooLong(error) => {
                    proptest::prop_assert!(known && !fits);
                    proptest::prop_assert_eq!(error.token_size, token.len());
                }
                Control::Stream { name } => {
                    proptest::prop_assert_eq!(command.as_slice(), b"STREAM".as_slice());
                    proptest::prop_assert_eq!(name, token.as_slice());
                }
                Control::Unknown { command: parsed } => {
                    proptest::prop_assert!(!known);
                    proptest::prop_assert_eq!(parsed, command.as_slice());
                }
            }
        }
    }

    /// Every reply the server writes parses back into what was written.
    #[test]
    fn replies_round_trip() {
        let mut out = Vec::new();
        write_ok(&mut out, 3, b"SYNC", b"done");
        write_ok(&mut out, 4, b"PING", b"");
        write_err(&mut out, 5, LineError::KeyEmpty);
        write_err(&mut out, 6, UnknownControl::new(b"NOPE"));
        let text = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            text,
            "OK 3 SYNC done\nOK 4 PING\nERR 5 key_empty: line starts with a space\n\
             ERR 6 unknown_control: #NOPE (known: #SYNC, #PING, #STREAM)\n"
        );
        let replies: Vec<Reply<'_>> = out.split(|&byte| byte == b'\n').filter_map(parse_reply).collect();
        assert_eq!(replies[0], Reply::Ok { line_number: 3, command: b"SYNC", token: b"done" });
        assert_eq!(replies[1], Reply::Ok { line_number: 4, command: b"PING", token: b"" });
        assert_eq!(
            replies[2],
            Reply::Err { line_number: 5, reason: b"key_empty", detail: b"line starts with a space" }
        );
        assert!(matches!(replies[3], Reply::Err { line_number: 6, reason: b"unknown_control", .. }));
        assert_eq!(parse_reply(b"HELLO 1 2"), None);
        assert_eq!(parse_reply(b"OK x SYNC"), None);
    }
}
