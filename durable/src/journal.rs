//! The embedded store: an append-only journal cut into time buckets.
//!
//! ```text
//! dir/LOCK                              held with an exclusive file lock while open
//! dir/META                              "corewheel-durable 1 <bucket width ms>"
//! dir/EPOCH                             the number of the latest open
//! dir/buckets/<start ms>/<epoch>-<n>.seg  tasks due in [start, start + width), and Done marks
//! dir/control/<epoch>-<n>.seg            tombstones (cancels and upserts)
//! dir/dead/<epoch>-<n>.seg               dead letters and their requeue marks
//! dir/dead.next/                        a rewritten dead-letter log on its way in
//! dir/trash/                            finished buckets (and old dead logs) on their way out
//! ```
//!
//! Each open appends only to segments of its own epoch, so a torn tail left by a crash is
//! always in a segment no one appends to again: it is cut when the segment is next read,
//! and never followed by good records. A bucket whose tasks are all finished is deleted
//! whole, so buckets need no compaction; the dead-letter log, mostly requeued letters
//! after a while, is rewritten whole at an open (`rewrite_dead`).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;
use crate::record::{Kind, Record, RecordReader, salvage};
use crate::store::{BucketInfo, SEQ_BITS, Store, Target};

/// A control segment is closed and a new one begun past this size, so that old
/// tombstones can be dropped a file at a time.
const CONTROL_SEGMENT_BYTES: u64 = 8 << 20;

/// The journal of one directory.
pub(crate) struct Journal {
    dir: PathBuf,
    epoch: u64,
    /// Held for the journal's life: the exclusive lock on `dir/LOCK`.
    _lock: File,
    writer: Mutex<WriterState>,
    /// Damaged spans that reads have passed over (a segment read twice counts twice).
    damaged_spans: AtomicU64,
}

struct OpenSegment {
    file: File,
    len: u64,
}

struct WriterState {
    open: HashMap<Target, OpenSegment>,
    next_segment: u64,
    /// Closed and active control segments with the largest sequence number each holds.
    control_segments: Vec<(PathBuf, u64)>,
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir`, refusing a directory another
    /// journal holds or one cut into buckets of another width.
    pub(crate) fn open(dir: &Path, bucket_ms: u64) -> Result<Journal, Error> {
        fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(Error::Locked),
            Err(fs::TryLockError::Error(e)) => return Err(Error::Io(e)),
        }
        check_meta(dir, bucket_ms)?;
        finish_dead_rewrite(dir)?;
        // Past every epoch on disk, even with EPOCH lost or restored from an old copy:
        // sequence numbers below an existing tombstone would be void at the next open.
        let last = read_number(&dir.join("EPOCH"))?.unwrap_or(0);
        let epoch = last.max(latest_segment_epoch(dir)?).saturating_add(1);
        if epoch >= 1 << (64 - SEQ_BITS) {
            return Err(Error::BadFormat("epoch counter exhausted".into()));
        }
        write_atomically(dir, "EPOCH", epoch.to_string().as_bytes())?;
        // Buckets a crash left half deleted were already gone as far as the journal knows.
        remove_dir_if_any(&dir.join("trash"))?;
        for sub in ["buckets", "control", "dead", "trash"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        sync_dir(dir)?;
        Ok(Journal {
            dir: dir.to_path_buf(),
            epoch,
            _lock: lock,
            writer: Mutex::new(WriterState {
                open: HashMap::new(),
                next_segment: 0,
                control_segments: Vec::new(),
            }),
            damaged_spans: AtomicU64::new(0),
        })
    }

    fn target_dir(&self, target: Target) -> PathBuf {
        match target {
            Target::Bucket(start) => self.dir.join("buckets").join(start.to_string()),
            Target::Control => self.dir.join("control"),
            Target::Dead => self.dir.join("dead"),
        }
    }

    /// Reads a segment's valid records. In an older open's segment, which no one appends
    /// to again, a bad record is either a torn tail, cut for good, or a damaged span with
    /// valid records after it (up to the end, or to a torn last frame): those are read
    /// too, and the file is left as it is.
    fn read_segment(
        &self,
        epoch: u64,
        path: &Path,
        each: &mut dyn FnMut(Record),
    ) -> io::Result<()> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let file_len = file.metadata()?.len();
        let mut reader = RecordReader::new(BufReader::with_capacity(1 << 16, file));
        while let Some(record) = reader.next_record()? {
            each(record);
        }
        let valid = reader.valid_len();
        if epoch < self.epoch && valid < file_len {
            let mut rest = Vec::new();
            let mut file = File::open(path)?;
            file.seek(SeekFrom::Start(valid))?;
            file.read_to_end(&mut rest)?;
            let (records, spans, ends_well) = salvage(&rest);
            // Records found after damage are read only if each was written by this
            // segment's open: a torn last record's payload may hold bytes that look like
            // a frame, and then that tail is cut.
            let written_here = |r: &Record| match r.kind {
                Kind::Task | Kind::Upsert | Kind::Tomb => r.seq >> SEQ_BITS == epoch,
                // A rewritten dead-letter log keeps each letter's sequence number.
                Kind::Dead | Kind::Done | Kind::Requeued => r.seq >> SEQ_BITS <= epoch,
            };
            if !ends_well || !records.iter().all(written_here) {
                let file = OpenOptions::new().write(true).open(path)?;
                file.set_len(valid)?;
                file.sync_all()?;
            } else {
                self.damaged_spans.fetch_add(spans, Ordering::Relaxed);
                eprintln!(
                    "corewheel-durable: {}: {spans} damaged span(s) from byte {valid} passed \
                     over, {} valid records after them read; what the damaged bytes held is lost",
                    path.display(),
                    records.len()
                );
                records.into_iter().for_each(each);
            }
        }
        Ok(())
    }

    /// [`Store::rewrite_dead`]'s steps: the new log is written whole beside the old, then
    /// the old moved out and the new moved in, each step durable before the next.
    fn try_rewrite_dead(&self, live: &[Record]) -> io::Result<()> {
        // A segment this open appended to leaves with the old folder: the next append
        // opens one in the new.
        let mut state = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        state.open.remove(&Target::Dead);
        let next = self.dir.join("dead.next");
        remove_dir_if_any(&next)?;
        fs::create_dir(&next)?;
        let mut bytes = Vec::new();
        for record in live {
            record.encode(&mut bytes);
        }
        // Named for the previous open: this open's own dead segments sort after it, and
        // its records' sequence numbers are all of earlier opens.
        let name = format!("{:010}-{:06}.seg", self.epoch.saturating_sub(1), 0);
        let mut file = File::create(next.join(name))?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        sync_dir(&next)?;
        sync_dir(&self.dir)?;
        let old = self.dir.join("trash").join(format!("dead-{}", self.epoch));
        fs::rename(self.dir.join("dead"), &old)?;
        sync_dir(&self.dir)?;
        fs::rename(&next, self.dir.join("dead"))?;
        sync_dir(&self.dir)?;
        // Left for the next open's emptying of the trash if it fails here.
        let _ = fs::remove_dir_all(&old);
        Ok(())
    }

    /// The open segment for `target`, created (and its folder entry made durable) if
    /// this open has none yet.
    fn segment<'a>(
        &self,
        state: &'a mut WriterState,
        target: Target,
    ) -> io::Result<&'a mut OpenSegment> {
        if !state.open.contains_key(&target) {
            let folder = self.target_dir(target);
            if !folder.exists() {
                fs::create_dir_all(&folder)?;
                sync_dir(folder.parent().unwrap_or(&self.dir))?;
            }
            let path = folder.join(format!("{:010}-{:06}.seg", self.epoch, state.next_segment));
            state.next_segment += 1;
            let file = OpenOptions::new()
                .create_new(true)
                .append(true)
                .open(&path)?;
            sync_dir(&folder)?;
            if target == Target::Control {
                state.control_segments.push((path, 0));
            }
            state.open.insert(target, OpenSegment { file, len: 0 });
        }
        Ok(state.open.get_mut(&target).expect("inserted above"))
    }
}

impl Store for Journal {
    fn rewrite_dead(&self, live: &[Record]) -> io::Result<()> {
        // A rewrite only saves space: one that fails is undone and the open goes on,
        // unless even that fails (then the folder is not as any step left it).
        if let Err(e) = self.try_rewrite_dead(live) {
            finish_dead_rewrite(&self.dir)?;
            eprintln!("corewheel-durable: rewriting the dead-letter log, left as it was: {e}");
        }
        Ok(())
    }

    fn damaged_spans(&self) -> u64 {
        self.damaged_spans.load(Ordering::Relaxed)
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn buckets(&self) -> io::Result<Vec<BucketInfo>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(self.dir.join("buckets"))? {
            let path = entry?.path();
            let Some(start_ms) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            // A numbered regular file (a backup, an editor's copy) is garbage like any
            // other stray name; reading it as a bucket would fail every open.
            if !path.is_dir() {
                continue;
            }
            let oldest = segments(&path)?.first().map(|(e, _)| *e);
            let min_seq = oldest.map_or(self.epoch, |e| e) << SEQ_BITS;
            out.push(BucketInfo { start_ms, min_seq });
        }
        out.sort_by_key(|b| b.start_ms);
        Ok(out)
    }

    fn read_bucket(&self, start_ms: u64, each: &mut dyn FnMut(Record)) -> io::Result<()> {
        for (epoch, path) in segments(&self.target_dir(Target::Bucket(start_ms)))? {
            self.read_segment(epoch, &path, each)?;
        }
        Ok(())
    }

    fn read_log(&self, target: Target) -> io::Result<Vec<Record>> {
        let folder = self.target_dir(target);
        let mut out = Vec::new();
        let mut state = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        for (epoch, path) in segments(&folder)? {
            let before = out.len();
            self.read_segment(epoch, &path, &mut |r| out.push(r))?;
            if target == Target::Control && epoch < self.epoch {
                let max = out[before..].iter().map(|r| r.seq).max().unwrap_or(0);
                state.control_segments.push((path, max));
            }
        }
        Ok(out)
    }

    fn append(&self, writes: &BTreeMap<Target, Vec<u8>>) -> io::Result<usize> {
        let mut state = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut touched: Vec<(Target, u64)> = Vec::with_capacity(writes.len());
        let result = (|| {
            for (&target, bytes) in writes {
                let segment = self.segment(&mut state, target)?;
                touched.push((target, segment.len));
                segment.file.write_all(bytes)?;
                segment.len += bytes.len() as u64;
            }
            for (target, _) in &touched {
                state.open[target].file.sync_data()?;
            }
            Ok(touched.len())
        })();
        if result.is_err() {
            // Cut what this call may have half-written, and start new segments: after a
            // failed fsync the page cache can no longer be trusted for these files.
            for (target, old_len) in touched {
                if let Some(segment) = state.open.remove(&target) {
                    let _ = segment.file.set_len(old_len);
                }
            }
        } else {
            for (&target, bytes) in writes {
                if target == Target::Control {
                    let max = max_seq(bytes);
                    if let Some(last) = state.control_segments.last_mut() {
                        last.1 = last.1.max(max);
                    }
                    if state.open[&Target::Control].len > CONTROL_SEGMENT_BYTES {
                        state.open.remove(&Target::Control);
                    }
                }
            }
        }
        result
    }

    fn delete_bucket(&self, start_ms: u64) -> io::Result<()> {
        let mut state = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        state.open.remove(&Target::Bucket(start_ms));
        let folder = self.target_dir(Target::Bucket(start_ms));
        // A bucket leaves in one rename: deleting its segments one by one could be cut
        // by a crash after a segment of Done marks went and before the tasks they finish.
        // Made again if someone removed it: a rename into a missing folder fails with
        // NotFound too, which must mean only that the bucket is gone already.
        fs::create_dir_all(self.dir.join("trash"))?;
        let trash = self
            .dir
            .join("trash")
            .join(format!("{start_ms}-{}-{}", self.epoch, state.next_segment));
        state.next_segment += 1;
        match fs::rename(&folder, &trash) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        sync_dir(&self.dir.join("buckets"))?;
        fs::remove_dir_all(&trash)
    }

    fn prune_control(&self, seq: u64) -> io::Result<()> {
        let mut state = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let active = state.open.contains_key(&Target::Control);
        let keep_last = usize::from(active);
        let closed = state.control_segments.len().saturating_sub(keep_last);
        let mut kept = Vec::new();
        for (i, (path, max)) in std::mem::take(&mut state.control_segments)
            .into_iter()
            .enumerate()
        {
            if i < closed && max < seq {
                fs::remove_file(&path)?;
            } else {
                kept.push((path, max));
            }
        }
        state.control_segments = kept;
        Ok(())
    }
}

/// The largest sequence number among encoded records.
fn max_seq(bytes: &[u8]) -> u64 {
    let mut reader = RecordReader::new(bytes);
    let mut max = 0;
    while let Ok(Some(r)) = reader.next_record() {
        max = max.max(r.seq);
    }
    max
}

/// The largest epoch in the name of any segment under `dir` (0 if none).
fn latest_segment_epoch(dir: &Path) -> io::Result<u64> {
    let mut folders = vec![dir.join("control"), dir.join("dead")];
    match fs::read_dir(dir.join("buckets")) {
        Ok(entries) => {
            for entry in entries {
                let path = entry?.path();
                if path.is_dir() {
                    folders.push(path);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut latest = 0;
    for folder in folders {
        if let Some((epoch, _)) = segments(&folder)?.last() {
            latest = latest.max(*epoch);
        }
    }
    Ok(latest)
}

/// The segments of a folder, oldest first, with their epochs.
fn segments(folder: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<((u64, u64), PathBuf)> = Vec::new();
    let entries = match fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        if let Some(key) = segment_key(&path) {
            out.push((key, path));
        }
    }
    out.sort();
    Ok(out.into_iter().map(|((epoch, _), p)| (epoch, p)).collect())
}

/// `(epoch, n)` from a segment file name `<epoch>-<n>.seg`.
fn segment_key(path: &Path) -> Option<(u64, u64)> {
    let name = path.file_name()?.to_str()?.strip_suffix(".seg")?;
    let (epoch, n) = name.split_once('-')?;
    Some((epoch.parse().ok()?, n.parse().ok()?))
}

fn check_meta(dir: &Path, bucket_ms: u64) -> Result<(), Error> {
    let path = dir.join("META");
    match fs::read_to_string(&path) {
        Ok(text) => {
            let mut words = text.split_whitespace();
            if words.next() != Some("corewheel-durable") || words.next() != Some("1") {
                return Err(Error::BadFormat(format!(
                    "{}: unknown format",
                    path.display()
                )));
            }
            let on_disk_ms: u64 = words
                .next()
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| Error::BadFormat(format!("{}: no bucket width", path.display())))?;
            if on_disk_ms != bucket_ms {
                return Err(Error::BucketWidthMismatch {
                    on_disk_ms,
                    requested_ms: bucket_ms,
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            write_atomically(
                dir,
                "META",
                format!("corewheel-durable 1 {bucket_ms}\n").as_bytes(),
            )?;
            Ok(())
        }
        Err(e) => Err(Error::Io(e)),
    }
}

fn read_number(path: &Path) -> Result<Option<u64>, Error> {
    let mut text = String::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_string(&mut text)?;
            text.trim()
                .parse()
                .map(Some)
                .map_err(|_| Error::BadFormat(format!("{}: not a number", path.display())))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Io(e)),
    }
}

/// Replaces `dir/name` with `bytes` so that a crash leaves the old or the new content.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Ends a rewrite of the dead-letter log that a crash cut: a complete new log whose old
/// one was already moved out is moved in; one written beside the old log is dropped.
fn finish_dead_rewrite(dir: &Path) -> io::Result<()> {
    let next = dir.join("dead.next");
    if !next.exists() {
        return Ok(());
    }
    if dir.join("dead").exists() {
        remove_dir_if_any(&next)?;
    } else {
        fs::rename(&next, dir.join("dead"))?;
    }
    sync_dir(dir)
}

/// Removes `dir` and all it holds; one already gone is no error.
fn remove_dir_if_any(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Makes a folder's entries (new or removed files) durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
