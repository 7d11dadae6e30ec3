//! The internode wire format: length-prefixed frames, pure and fuzzable.
//!
//! ```text
//! frame   = length:u32 LE (bytes after it, 1..=FRAME_BYTES_MAX - 4) kind:u8 body
//! Hello   (1) magic:[u8; 8] version:u16 from:u128 to:u128      dialer -> acceptor
//! Welcome (2) magic:[u8; 8] version:u16 node:u128 window:u32   acceptor -> dialer
//! Refuse  (3) reason: UTF-8 text, at most REFUSE_REASON_BYTES_MAX
//! Data    (4) channel:u8 payload                               dialer -> acceptor
//! Credit  (5) bytes:u32                                        acceptor -> dialer
//! ```
//!
//! Every integer is little-endian, like spate's record and log formats. The
//! handshake frames start with the magic and the version at fixed offsets,
//! so any later version can still read them and refuse a mismatch by name.
//! A connection carries data one way only (from the node that dialed); the
//! other way carries only credits, so every node has one outbound
//! connection per peer for its messages and one inbound from each peer.
//!
//! [`decode`] never panics and never allocates: a frame longer than
//! [`FRAME_BYTES_MAX`] is an error as soon as its length prefix is read (so
//! a peer cannot make a receiver buffer more than that), an empty one, an
//! unknown kind or a body of the wrong size is an error too, and a short
//! buffer is `Ok(None)` (read more).

use crate::cluster::identity::NodeId;

/// The transport protocol's version: a peer speaking another is refused at
/// the handshake with both versions named.
pub const PROTOCOL_VERSION: u16 = 1;
/// The first bytes of a handshake frame's body: tells a stray client (an
/// HTTP request, a port scan) from a spate node.
pub const MAGIC: [u8; 8] = *b"spate-tp";
/// The length prefix, in bytes.
pub const LENGTH_BYTES: usize = 4;
/// The largest frame, prefix included, in bytes
/// ([`TRANSPORT_FRAME_BYTES_MAX`](crate::config::TRANSPORT_FRAME_BYTES_MAX)).
pub use crate::config::TRANSPORT_FRAME_BYTES_MAX as FRAME_BYTES_MAX;
/// The bytes a data frame adds to its payload (prefix, kind, channel).
pub const DATA_HEADER_BYTES: usize = LENGTH_BYTES + 2;
/// The largest payload of one message.
pub const PAYLOAD_BYTES_MAX: usize = FRAME_BYTES_MAX - DATA_HEADER_BYTES;
/// The longest reason a refusal carries, in bytes.
pub const REFUSE_REASON_BYTES_MAX: usize = 512;

const KIND_HELLO: u8 = 1;
const KIND_WELCOME: u8 = 2;
const KIND_REFUSE: u8 = 3;
const KIND_DATA: u8 = 4;
const KIND_CREDIT: u8 = 5;
/// Body of Hello and Welcome after the kind: magic, version, two u128 (or
/// one u128 and a u32).
const HELLO_BODY_BYTES: usize = 8 + 2 + 16 + 16;
const WELCOME_BODY_BYTES: usize = 8 + 2 + 16 + 4;

/// One decoded frame, borrowing the buffer it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// The dialer names itself and the node it means to reach.
    Hello { version: u16, from: NodeId, to: NodeId },
    /// The acceptor agrees, names itself and grants the dialer a window of
    /// `window_bytes` of data frames in flight.
    Welcome { version: u16, node: NodeId, window_bytes: u32 },
    /// The handshake failed; the reason is for the operator's log.
    Refuse { reason: &'a [u8] },
    /// One message on `channel`.
    Data { channel: u8, payload: &'a [u8] },
    /// The acceptor consumed `bytes` of data frames: the dialer may send
    /// that many more.
    Credit { bytes: u32 },
}

/// Why a buffer does not hold a valid frame: the connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The length prefix claims more than [`FRAME_BYTES_MAX`].
    TooLarge {
        frame_bytes: u64,
        frame_bytes_max: usize,
    },
    /// A length of zero: no kind.
    Empty,
    UnknownKind {
        kind: u8,
    },
    /// A body whose size does not match its kind.
    BadBody {
        kind: u8,
        body_bytes: usize,
    },
    /// A handshake frame without the magic: not a spate node.
    BadMagic,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::TooLarge { frame_bytes, frame_bytes_max } => {
                write!(f, "a frame of {frame_bytes} bytes is over the limit of {frame_bytes_max}")
            }
            DecodeError::Empty => write!(f, "an empty frame"),
            DecodeError::UnknownKind { kind } => write!(f, "an unknown frame kind {kind}"),
            DecodeError::BadBody { kind, body_bytes } => {
                write!(f, "a frame of kind {kind} with a body of {body_bytes} bytes")
            }
            DecodeError::BadMagic => write!(f, "not a spate transport handshake (bad magic)"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The bytes a data frame of `payload_bytes` takes on the wire: what it
/// costs in credits.
pub const fn data_frame_bytes(payload_bytes: usize) -> usize {
    DATA_HEADER_BYTES + payload_bytes
}

/// Appends a data frame. The caller checked `payload.len() <=
/// PAYLOAD_BYTES_MAX`.
pub fn encode_data(out: &mut Vec<u8>, channel: u8, payload: &[u8]) {
    debug_assert!(payload.len() <= PAYLOAD_BYTES_MAX);
    out.extend_from_slice(&((payload.len() + 2) as u32).to_le_bytes());
    out.extend_from_slice(&[KIND_DATA, channel]);
    out.extend_from_slice(payload);
}

/// Appends any frame (handshakes, credits; data through [`encode_data`]).
pub fn encode(out: &mut Vec<u8>, frame: &Frame<'_>) {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_BYTES]);
    match *frame {
        Frame::Hello { version, from, to } => {
            out.push(KIND_HELLO);
            out.extend_from_slice(&MAGIC);
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&from.0.to_le_bytes());
            out.extend_from_slice(&to.0.to_le_bytes());
        }
        Frame::Welcome { version, node, window_bytes } => {
            out.push(KIND_WELCOME);
            out.extend_from_slice(&MAGIC);
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&node.0.to_le_bytes());
            out.extend_from_slice(&window_bytes.to_le_bytes());
        }
        Frame::Refuse { reason } => {
            out.push(KIND_REFUSE);
            out.extend_from_slice(&reason[..reason.len().min(REFUSE_REASON_BYTES_MAX)]);
        }
        Frame::Data { channel, payload } => {
            out.extend_from_slice(&[KIND_DATA, channel]);
            out.extend_from_slice(payload);
        }
        Frame::Credit { bytes } => {
            out.push(KIND_CREDIT);
            out.extend_from_slice(&bytes.to_le_bytes());
        }
    }
    let length = (out.len() - start - LENGTH_BYTES) as u32;
    out[start..start + LENGTH_BYTES].copy_from_slice(&length.to_le_bytes());
}

/// The first frame of `buffer` and the bytes it took, `Ok(None)` when the
/// buffer holds only part of it.
pub fn decode(buffer: &[u8]) -> Result<Option<(Frame<'_>, usize)>, DecodeError> {
    let Some(prefix) = buffer.first_chunk::<LENGTH_BYTES>() else { return Ok(None) };
    let length = u32::from_le_bytes(*prefix) as usize;
    if length == 0 {
        return Err(DecodeError::Empty);
    }
    if length > FRAME_BYTES_MAX - LENGTH_BYTES {
        let frame_bytes = length as u64 + LENGTH_BYTES as u64;
        return Err(DecodeError::TooLarge { frame_bytes, frame_bytes_max: FRAME_BYTES_MAX });
    }
    let Some(frame) = buffer.get(LENGTH_BYTES..LENGTH_BYTES + length) else { return Ok(None) };
    let (kind, body) = (frame[0], &frame[1..]);
    let bad_body = DecodeError::BadBody { kind, body_bytes: body.len() };
    let decoded = match kind {
        KIND_HELLO | KIND_WELCOME => decode_handshake(kind, body).ok_or(bad_body)??,
        KIND_REFUSE if body.len() <= REFUSE_REASON_BYTES_MAX => Frame::Refuse { reason: body },
        KIND_DATA => match body.split_first() {
            Some((&channel, payload)) => Frame::Data { channel, payload },
            None => return Err(bad_body),
        },
        KIND_CREDIT => Frame::Credit { bytes: u32::from_le_bytes(*body.first_chunk::<4>().ok_or(bad_body)?) },
        KIND_REFUSE => return Err(bad_body),
        _ => return Err(DecodeError::UnknownKind { kind }),
    };
    if kind == KIND_CREDIT && body.len() != 4 {
        return Err(bad_body);
    }
    Ok(Some((decoded, LENGTH_BYTES + length)))
}

/// A Hello or Welcome body: `None` when its size is wrong, `Some(Err)` when
/// the magic is.
fn decode_handshake(kind: u8, body: &[u8]) -> Option<Result<Frame<'static>, DecodeError>> {
    let expected = if kind == KIND_HELLO { HELLO_BODY_BYTES } else { WELCOME_BODY_BYTES };
    // A newer version may append fields: only the fixed start must be there,
    // and the version check refuses it by name.
    if body.len() < 10 {
        return None;
    }
    if body[..8] != MAGIC {
        return Some(Err(DecodeError::BadMagic));
    }
    let version = u16::from_le_bytes([body[8], body[9]]);
    if body.len() != expected {
        // Only a frame of this version must have this exact size; another
        // version gets a frame naming only its version, refused by name.
        let other = if kind == KIND_HELLO {
            Frame::Hello { version, from: NodeId(0), to: NodeId(0) }
        } else {
            Frame::Welcome { version, node: NodeId(0), window_bytes: 0 }
        };
        return (version != PROTOCOL_VERSION).then_some(Ok(other));
    }
    let u128_at = |at: usize| u128::from_le_bytes(body[at..at + 16].try_into().unwrap_or([0; 16]));
    Some(Ok(if kind == KIND_HELLO {
        Frame::Hello { version, from: NodeId(u128_at(10)), to: NodeId(u128_at(26)) }
    } else {
        let window_bytes = u32::from_le_bytes(body[26..30].try_into().unwrap_or([0; 4]));
        Frame::Welcome { version, node: NodeId(u128_at(10)), window_bytes }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: Frame<'_>) {
        let mut out = Vec::new();
        encode(&mut out, &frame);
        out.extend_from_slice(b"next");
        let (decoded, used) = decode(&out).unwrap().unwrap();
        assert_eq!((decoded, used), (frame, out.len() - 4));
        for cut in 0..used {
            assert_eq!(decode(&out[..cut]), Ok(None), "a frame cut at {cut} needs more bytes");
        }
    }

    /// Every frame kind decodes to what was encoded, and a partial frame
    /// asks for more bytes rather than failing.
    #[test]
    fn frames_round_trip() {
        round_trip(Frame::Hello { version: PROTOCOL_VERSION, from: NodeId(u128::MAX), to: NodeId(7) });
        round_trip(Frame::Welcome { version: PROTOCOL_VERSION, node: NodeId(3), window_bytes: u32::MAX });
        round_trip(Frame::Refuse { reason: b"protocol version 2, this node speaks 1" });
        round_trip(Frame::Data { channel: 9, payload: b"" });
        round_trip(Frame::Data { channel: 1, payload: &[0xab; 1000] });
        round_trip(Frame::Credit { bytes: 65536 });
        let mut out = Vec::new();
        encode_data(&mut out, 3, b"payload");
        assert_eq!(out.len(), data_frame_bytes(7));
        assert_eq!(decode(&out).unwrap().unwrap().0, Frame::Data { channel: 3, payload: b"payload" });
    }

    /// A length over the limit is refused from its prefix alone, so a peer
    /// cannot make the receiver wait for (and buffer) a huge frame.
    #[test]
    fn oversized_frames_are_refused_from_the_prefix() {
        let prefix = ((FRAME_BYTES_MAX - LENGTH_BYTES + 1) as u32).to_le_bytes();
        assert!(matches!(decode(&prefix), Err(DecodeError::TooLarge { .. })));
        assert!(decode(&u32::MAX.to_le_bytes()).unwrap_err().to_string().contains("over the limit"));
        assert_eq!(decode(&[0, 0, 0, 0]), Err(DecodeError::Empty));
        assert_eq!(decode(&[1, 0, 0, 0, 99]), Err(DecodeError::UnknownKind { kind: 99 }));
        assert_eq!(
            decode(&[2, 0, 0, 0, KIND_CREDIT, 1]),
            Err(DecodeError::BadBody { kind: KIND_CREDIT, body_bytes: 1 })
        );
        let mut http = b"GET / HTTP/1.1\r\n".to_vec();
        http.resize(64, b' ');
        assert!(decode(&http).is_err(), "an HTTP request is not a frame");
    }

    /// A handshake of another version is read far enough to be refused by
    /// its version, whatever its size; a wrong magic is not a spate node.
    #[test]
    fn other_versions_and_strangers_are_recognised() {
        let mut out = Vec::new();
        encode(&mut out, &Frame::Hello { version: 2, from: NodeId(1), to: NodeId(2) });
        out.extend_from_slice(&[0; 5]);
        let length = (out.len() - LENGTH_BYTES) as u32;
        out[..4].copy_from_slice(&length.to_le_bytes());
        match decode(&out).unwrap().unwrap().0 {
            Frame::Hello { version, .. } => assert_eq!(version, 2),
            other => panic!("{other:?}"),
        }
        out[5] = b'X';
        assert_eq!(decode(&out), Err(DecodeError::BadMagic));
    }

    /// Random bytes never panic the decoder, and whatever it accepts it
    /// consumes at least one byte of and at most the buffer (fuzz-style:
    /// a million bytes of seeded garbage, and garbage after valid frames).
    #[test]
    fn garbage_never_panics() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut decoded = 0usize;
        for round in 0..20_000 {
            let size = (next() % 96) as usize;
            let mut buffer: Vec<u8> = (0..size).map(|_| next() as u8).collect();
            if round % 3 == 0 && size >= 5 {
                // A plausible small length, so the body parsers run too.
                let length = (next() % size as u64) as u32;
                buffer[..4].copy_from_slice(&length.to_le_bytes());
                buffer[4] = (next() % 7) as u8;
            }
            let mut rest = &buffer[..];
            while let Ok(Some((_, used))) = decode(rest) {
                assert!(used > 0 && used <= rest.len());
                rest = &rest[used..];
                decoded += 1;
            }
        }
        assert!(decoded > 100, "the garbage reached the body parsers ({decoded} frames)");
    }
}
