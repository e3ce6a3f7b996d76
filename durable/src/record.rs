//! One journal record and its checksummed encoding.
//!
//! Every record is framed as `len: u32 LE | crc32: u32 LE | body`, where the CRC covers the
//! body. The body is `kind: u8 | seq: u64 | due_ms: u64 | attempt: u32 | id_len: u16 | id |
//! payload`, all little-endian. A reader stops at the first frame whose length is out of
//! range or whose checksum does not match: a torn tail, or a damaged span, after which
//! [`salvage`] finds the records that follow.

use std::io::{self, Read};

/// Bytes before the body: the length and the checksum.
pub(crate) const FRAME_HEADER: usize = 8;
/// Bytes of a body before the id.
const BODY_FIXED: usize = 1 + 8 + 8 + 4 + 2;
/// The largest body a reader accepts; anything longer is a corrupted length field.
pub(crate) const MAX_BODY: usize = BODY_FIXED + crate::MAX_ID_LEN + crate::MAX_PAYLOAD_LEN;

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A pending task: id, payload, due time, attempt, in the bucket of its due time.
    Task = 1,
    /// The task `(id, seq)` of this bucket is finished: acked, moved to a retry, or
    /// dead-lettered.
    Done = 2,
    /// Every record of `id` with a sequence number below `seq` is void (cancel or upsert).
    /// A requeue's tombstone carries in its payload the sequence number of the dead letter
    /// it requeues ([`requeued_letter`](Record::requeued_letter)), so that its task and the
    /// letter's leaving are one record: a crash cannot keep both.
    Tomb = 3,
    /// A task that failed its last attempt, kept in the dead-letter log.
    Dead = 4,
    /// The dead letter `(id, seq)` was requeued and leaves the dead-letter list.
    Requeued = 5,
    /// A pending task like `Task`, written with a tombstone of the same sequence number in
    /// the same commit (an upsert): live only once that tombstone is durable too.
    Upsert = 6,
}

impl Kind {
    fn from_u8(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Task,
            2 => Kind::Done,
            3 => Kind::Tomb,
            4 => Kind::Dead,
            5 => Kind::Requeued,
            6 => Kind::Upsert,
            _ => return None,
        })
    }
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub kind: Kind,
    /// The record's own sequence number (`Task`, `Tomb`, `Dead`) or the one it refers to
    /// (`Done`, `Requeued`).
    pub seq: u64,
    /// Due time in milliseconds since the Unix epoch (`Task`, `Dead`), else 0.
    pub due_ms: u64,
    /// The attempt this task is on, from 1.
    pub attempt: u32,
    pub id: Box<[u8]>,
    pub payload: Box<[u8]>,
}

impl Record {
    /// A record that carries only an id and a sequence number.
    pub(crate) fn marker(kind: Kind, id: &[u8], seq: u64) -> Record {
        Record {
            kind,
            seq,
            due_ms: 0,
            attempt: 0,
            id: id.into(),
            payload: Box::default(),
        }
    }

    /// The dead letter a requeue's tombstone requeues, if this is one.
    pub(crate) fn requeued_letter(&self) -> Option<u64> {
        match (self.kind, <[u8; 8]>::try_from(&*self.payload)) {
            (Kind::Tomb, Ok(seq)) => Some(u64::from_le_bytes(seq)),
            _ => None,
        }
    }

    /// Appends the framed record to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let body_len = BODY_FIXED + self.id.len() + self.payload.len();
        let start = out.len();
        out.extend_from_slice(&(body_len as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.push(self.kind as u8);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.due_ms.to_le_bytes());
        out.extend_from_slice(&self.attempt.to_le_bytes());
        out.extend_from_slice(&(self.id.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.id);
        out.extend_from_slice(&self.payload);
        let crc = crc32fast::hash(&out[start + FRAME_HEADER..]);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes a body whose checksum has been verified; `None` if it is malformed.
    fn decode_body(body: &[u8]) -> Option<Record> {
        if body.len() < BODY_FIXED {
            return None;
        }
        let kind = Kind::from_u8(body[0])?;
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
        let seq = u64_at(1);
        let due_ms = u64_at(9);
        let attempt = u32::from_le_bytes(body[17..21].try_into().unwrap());
        let id_len = u16::from_le_bytes(body[21..23].try_into().unwrap()) as usize;
        let rest = &body[BODY_FIXED..];
        if id_len > rest.len() {
            return None;
        }
        Some(Record {
            kind,
            seq,
            due_ms,
            attempt,
            id: rest[..id_len].into(),
            payload: rest[id_len..].into(),
        })
    }
}

/// Reads framed records one at a time and remembers where the valid prefix ends.
pub(crate) struct RecordReader<R> {
    inner: R,
    valid_len: u64,
    body: Vec<u8>,
}

impl<R: Read> RecordReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        Self {
            inner,
            valid_len: 0,
            body: Vec::new(),
        }
    }

    /// Bytes from the start that hold whole, valid records read so far.
    pub(crate) fn valid_len(&self) -> u64 {
        self.valid_len
    }

    /// The next record, or `None` at the end of the valid prefix (clean end, torn frame or
    /// bad checksum alike). Only an I/O error from the underlying reader is an error.
    pub(crate) fn next_record(&mut self) -> io::Result<Option<Record>> {
        let mut header = [0u8; FRAME_HEADER];
        if !read_full(&mut self.inner, &mut header)? {
            return Ok(None);
        }
        let Some(len) = declared_len(&header) else {
            return Ok(None);
        };
        self.body.resize(len, 0);
        if !read_full(&mut self.inner, &mut self.body)? {
            return Ok(None);
        }
        let Some(record) = checked_body(&header, &self.body) else {
            return Ok(None);
        };
        self.valid_len += (FRAME_HEADER + len) as u64;
        Ok(Some(record))
    }
}

/// The body length a frame starting with `bytes` declares, if `bytes` hold its length
/// field and the length is in range.
fn declared_len(bytes: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().unwrap()) as usize;
    (BODY_FIXED..=MAX_BODY).contains(&len).then_some(len)
}

/// The record in `body`, if the checksum in `header` matches it and it is well formed.
fn checked_body(header: &[u8], body: &[u8]) -> Option<Record> {
    let crc = u32::from_le_bytes(header[4..FRAME_HEADER].try_into().unwrap());
    if crc32fast::hash(body) != crc {
        return None;
    }
    Record::decode_body(body)
}

/// The record framed at the start of `bytes` and the frame's length, if a whole frame is
/// there with a matching checksum and a well-formed body.
fn frame_at(bytes: &[u8]) -> Option<(Record, usize)> {
    let header = bytes.get(..FRAME_HEADER)?;
    let len = declared_len(header)?;
    let record = checked_body(header, bytes.get(FRAME_HEADER..FRAME_HEADER + len)?)?;
    Some((record, FRAME_HEADER + len))
}

/// The valid records in `bytes`, which start with a bad frame, with how many bad spans
/// were followed by a valid record and whether it ends well: some record was found, and
/// what follows the last is nothing or a torn frame (one whose declared length runs past
/// the end, as a crash leaves the last record), rather than more damage.
///
/// A frame whose length holds but whose checksum fails is passed over whole when a valid
/// frame follows it. Otherwise bytes are passed over one at a time until a whole frame
/// with a matching checksum decodes, and records are read on from there. A payload can
/// hold bytes that look like a frame: the caller decides whether what was found can be
/// trusted (the journal also checks each record's epoch).
pub(crate) fn salvage(bytes: &[u8]) -> (Vec<Record>, u64, bool) {
    let mut at = match declared_len(bytes) {
        Some(len)
            if FRAME_HEADER + len <= bytes.len()
                && frame_at(&bytes[FRAME_HEADER + len..]).is_some() =>
        {
            FRAME_HEADER + len
        }
        _ => 1,
    };
    let (mut records, mut spans, mut in_bad_span, mut last_end) = (Vec::new(), 0, true, 0);
    while at < bytes.len() {
        match frame_at(&bytes[at..]) {
            Some((record, len)) => {
                spans += u64::from(in_bad_span);
                in_bad_span = false;
                records.push(record);
                at += len;
                last_end = at;
            }
            None => {
                in_bad_span = true;
                at += 1;
            }
        }
    }
    let rest = &bytes[last_end..];
    let torn_or_clean = rest.is_empty()
        || rest.len() < FRAME_HEADER
        || declared_len(rest).is_some_and(|len| FRAME_HEADER + len > rest.len());
    let ends_well = !records.is_empty() && torn_or_clean;
    (records, spans, ends_well)
}

/// Fills `buf`, or returns `false` if the reader ends first.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => return Ok(false),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str) -> Record {
        Record {
            kind: Kind::Task,
            seq: 7,
            due_ms: 1_700_000_000_000,
            attempt: 2,
            id: id.as_bytes().into(),
            payload: b"payload".as_slice().into(),
        }
    }

    #[test]
    fn round_trip_and_torn_tail() {
        let mut buf = Vec::new();
        task("a").encode(&mut buf);
        let first_len = buf.len() as u64;
        task("b").encode(&mut buf);
        buf.truncate(buf.len() - 3);
        let mut reader = RecordReader::new(buf.as_slice());
        assert_eq!(reader.next_record().unwrap(), Some(task("a")));
        assert_eq!(reader.next_record().unwrap(), None);
        assert_eq!(reader.valid_len(), first_len);
    }

    #[test]
    fn flipped_bit_ends_the_valid_prefix() {
        let mut buf = Vec::new();
        task("a").encode(&mut buf);
        let last = buf.len() - 1;
        buf[last] ^= 1;
        let mut reader = RecordReader::new(buf.as_slice());
        assert_eq!(reader.next_record().unwrap(), None);
        assert_eq!(reader.valid_len(), 0);
    }

    /// Frames of tasks "0".."n" and where each starts.
    fn frames(n: usize) -> (Vec<u8>, Vec<usize>) {
        let (mut buf, mut starts) = (Vec::new(), Vec::new());
        for i in 0..n {
            starts.push(buf.len());
            task(&i.to_string()).encode(&mut buf);
        }
        (buf, starts)
    }

    fn ids(records: &[Record]) -> Vec<String> {
        records
            .iter()
            .map(|r| String::from_utf8_lossy(&r.id).into_owned())
            .collect()
    }

    #[test]
    fn salvage_finds_the_records_after_damaged_spans_and_counts_the_spans() {
        let (mut buf, starts) = frames(8);
        buf[starts[2] + 12] ^= 0x40; // a body byte of record 2: its checksum fails
        buf[starts[5] + 1] ^= 0x7f; // the length field of record 5: out of range
        buf[starts[6] + 3] ^= 0x01;
        let mut reader = RecordReader::new(buf.as_slice());
        let mut before = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            before.push(record);
        }
        assert_eq!(ids(&before), ["0", "1"]);
        let (after, spans, to_the_end) = salvage(&buf[reader.valid_len() as usize..]);
        assert_eq!(ids(&after), ["3", "4", "7"]);
        assert_eq!(spans, 2);
        assert!(to_the_end);
        let (after, spans, to_the_end) = salvage(&buf[starts[2]..buf.len() - 1]);
        assert_eq!(
            (ids(&after), spans, to_the_end),
            (vec!["3".into(), "4".into()], 1, true)
        );
    }

    #[test]
    fn a_frame_inside_a_torn_records_payload_is_found_and_left_to_the_caller() {
        let mut inner = Vec::new();
        task("forged").encode(&mut inner);
        let mut buf = Vec::new();
        let mut carrier = task("carrier");
        carrier.payload = [inner.as_slice(), b"rest of the payload"].concat().into();
        carrier.encode(&mut buf);
        // Torn right after the frame in its payload: salvage cannot tell it from a real
        // one; the journal keeps it only if its epoch is the segment's (it is 0 here).
        let inner_end = buf.len() - b"rest of the payload".len();
        let (after, spans, _) = salvage(&buf[..inner_end]);
        assert_eq!((ids(&after), spans), (vec!["forged".into()], 1));
        // Damaged inside its body, but whole: passed over whole, not read inside.
        task("next").encode(&mut buf);
        buf[FRAME_HEADER + 2] ^= 0x10;
        let (after, spans, to_the_end) = salvage(&buf);
        assert_eq!(
            (ids(&after), spans, to_the_end),
            (vec!["next".into()], 1, true)
        );
    }

    #[test]
    fn salvage_of_a_torn_tail_finds_nothing() {
        let (buf, starts) = frames(3);
        let (after, spans, to_the_end) = salvage(&buf[starts[2]..buf.len() - 1]);
        assert_eq!((after.len(), spans, to_the_end), (0, 0, false));
        let (after, spans, to_the_end) = salvage(&[0; 100]);
        assert_eq!((after.len(), spans, to_the_end), (0, 0, false));
    }
}
