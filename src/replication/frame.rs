//! What a Raft entry of a partition group carries: a spate frame (a batch of
//! records, never one event) behind a fixed header that names who proposed
//! it, so a forwarded batch retried after a leader change can be recognised
//! and dropped: a leader looks for a retry's header in its log
//! ([`crate::replication::node`], "Retries").
//!
//! Layout (little-endian): `version: u8 = 1`, `source_node: u64` (the
//! proposing node's replica id), `source_sequence: u64` (per source and
//! group, increasing), `record_count: u32`, then the records exactly as the
//! partition log stores them. Entries with no data are Raft's own (a new
//! leader's empty entry) and carry no frame.

/// Bytes before the records.
pub const PROPOSAL_HEADER_BYTES: usize = 1 + 8 + 8 + 4;
/// The only layout so far.
pub const PROPOSAL_VERSION: u8 = 1;

/// Who proposed an entry, for deduplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProposalHeader {
    pub source_node: u64,
    pub source_sequence: u64,
    pub record_count: u32,
}

/// Why an entry's bytes are not a proposal frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    TooShort { frame_bytes: usize, header_bytes: usize },
    UnknownVersion { version: u8 },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a replicated frame: {self:?}")
    }
}

impl std::error::Error for FrameError {}

/// The entry data for the records of `parts` (their log format
/// concatenates) proposed by `header`.
pub fn encode_proposal<T: AsRef<[u8]>>(header: ProposalHeader, parts: &[T]) -> Vec<u8> {
    let mut data = Vec::new();
    encode_proposal_into(&mut data, header, parts);
    data
}

/// Appends to `out` the entry data for the records of `parts`, one after
/// the other, proposed by `header`: a run of several proposals is copied
/// once, into the entry, rather than joined first.
pub fn encode_proposal_into<T: AsRef<[u8]>>(out: &mut Vec<u8>, header: ProposalHeader, parts: &[T]) {
    out.reserve(PROPOSAL_HEADER_BYTES + parts.iter().map(|part| part.as_ref().len()).sum::<usize>());
    out.push(PROPOSAL_VERSION);
    out.extend_from_slice(&header.source_node.to_le_bytes());
    out.extend_from_slice(&header.source_sequence.to_le_bytes());
    out.extend_from_slice(&header.record_count.to_le_bytes());
    for part in parts {
        out.extend_from_slice(part.as_ref());
    }
}

/// The header and the records of an entry's data.
pub fn decode_proposal(data: &[u8]) -> Result<(ProposalHeader, &[u8]), FrameError> {
    let Some((header_bytes, records)) = data.split_at_checked(PROPOSAL_HEADER_BYTES) else {
        return Err(FrameError::TooShort { frame_bytes: data.len(), header_bytes: PROPOSAL_HEADER_BYTES });
    };
    if header_bytes[0] != PROPOSAL_VERSION {
        return Err(FrameError::UnknownVersion { version: header_bytes[0] });
    }
    let word = |range: std::ops::Range<usize>| {
        let mut bytes = [0u8; 8];
        bytes[..range.len()].copy_from_slice(&header_bytes[range]);
        u64::from_le_bytes(bytes)
    };
    let header =
        ProposalHeader { source_node: word(1..9), source_sequence: word(9..17), record_count: word(17..21) as u32 };
    Ok((header, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame decodes to what was encoded; short or foreign bytes are an
    /// error, never a panic.
    #[test]
    fn proposal_round_trips_and_rejects_garbage() {
        let header = ProposalHeader { source_node: 7, source_sequence: u64::MAX, record_count: 3 };
        let data = encode_proposal(header, &[b"abc"]);
        assert_eq!(decode_proposal(&data), Ok((header, &b"abc"[..])));
        assert!(matches!(decode_proposal(&data[..5]), Err(FrameError::TooShort { .. })));
        let mut foreign = data.clone();
        foreign[0] = 9;
        assert_eq!(decode_proposal(&foreign), Err(FrameError::UnknownVersion { version: 9 }));
    }
}
