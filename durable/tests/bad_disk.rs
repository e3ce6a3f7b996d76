//! Bad disks on real files: a torn segment tail and flipped bytes in another segment's last
//! record are cut at reopen without losing what was written before them; flipped bytes
//! inside a segment lose only the damaged record; and a write that hits a file-size limit
//! fails its call with a typed error and harms nothing acknowledged, nor a failed delete or
//! a removed folder of the store.

mod common;

use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{collect, manual, next, one_attempt, quiet, t0};
use corewheel_durable::{DurableTimers, Error, ManualWallClock, Options, WallClock};

const SEC: Duration = Duration::from_secs(1);
const MIN: Duration = Duration::from_secs(60);

/// The folder of the bucket starting at `start`.
fn bucket_dir(dir: &Path, start: SystemTime) -> PathBuf {
    let ms = start
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    dir.join("buckets").join(ms.to_string())
}

/// The one segment file of the bucket starting at `start`.
fn segment_of(dir: &Path, start: SystemTime) -> PathBuf {
    let folder = bucket_dir(dir, start);
    let mut segments: Vec<PathBuf> = fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    assert_eq!(segments.len(), 1, "one segment in {}", folder.display());
    segments.pop().unwrap()
}

/// Flips bits of the two bytes at `at`, as bit rot does.
fn flip_two_bytes(path: &Path, at: u64) {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8; 2];
    file.seek(SeekFrom::Start(at)).unwrap();
    file.read_exact(&mut byte).unwrap();
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&[byte[0] ^ 0xff, byte[1] ^ 0x5a]).unwrap();
}

fn len(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

#[test]
fn torn_and_corrupt_segment_tails_are_cut_and_everything_before_them_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let hour = Duration::from_secs(3600);
    // Two buckets (an hour wide, starting at t0 and t0 + 1 h), each written by one
    // schedule call per task, so each task is one record, in order, of the same size.
    let n = 20;
    let due = |bucket: u32, i: u32| t0() + hour * bucket + 10 * MIN + Duration::from_secs(i.into());
    {
        let (_clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        for bucket in 0..2 {
            for i in 0..n {
                let id = format!("{bucket}-{i:02}");
                timers.schedule(&id, id.as_bytes(), due(bucket, i)).unwrap();
            }
        }
        timers.close().unwrap();
    }
    let first = segment_of(dir.path(), t0());
    let last = segment_of(dir.path(), t0() + hour);
    let record = len(&first) / u64::from(n);
    assert_eq!(len(&first), record * u64::from(n));
    assert_eq!(len(&last), record * u64::from(n));
    // The last segment written loses the end of its last record, as a crash mid-write
    // leaves it; the other gets flipped bytes in its last record, as bit rot does.
    OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len(&last) - record / 2)
        .unwrap();
    flip_two_bytes(&first, len(&first) - 3);

    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    // Reading the segments at open cuts each at its damaged record, for good.
    common::eventually(|| {
        len(&first) == record * u64::from(n - 1) && len(&last) == record * u64::from(n - 1)
    });
    let rx = collect(&timers, |_, _| false);
    clock.set(due(0, 0) - Duration::from_millis(1));
    quiet(&rx, 200);
    let mut seen = HashMap::new();
    for bucket in 0..2 {
        for i in 0..n - 1 {
            // One step per task: each is delivered only once the clock reads its due time.
            clock.set(due(bucket, i));
            let s = next(&rx);
            assert!(s.due <= clock.now(), "{} early", s.id);
            assert_eq!(s.payload, s.id.as_bytes(), "payload of {}", s.id);
            *seen.entry(s.id).or_insert(0) += 1;
        }
    }
    clock.set(t0() + 3 * hour);
    quiet(&rx, 300);
    let expected: HashSet<String> = (0..2)
        .flat_map(|b| (0..n - 1).map(move |i| format!("{b}-{i:02}")))
        .collect();
    assert_eq!(seen.keys().cloned().collect::<HashSet<_>>(), expected);
    assert!(
        seen.values().all(|&c| c == 1),
        "each delivered once: {seen:?}"
    );
    timers.close().unwrap();
}

/// Tasks in [`tasks_in_one_segment`].
const TASKS: u32 = 20;

/// When task `i` of [`tasks_in_one_segment`] is due.
fn due_of(i: u32) -> SystemTime {
    t0() + 10 * MIN + Duration::from_secs(i.into())
}

/// Schedules tasks "00" to "19" (payload: the id), due a second apart, one call each, so
/// that each is one record, all of one size, in the one segment of the bucket at t0.
/// Returns that segment and a record's length.
fn tasks_in_one_segment(dir: &Path) -> (PathBuf, u64) {
    let (_clock, options) = manual();
    let timers = DurableTimers::open(dir, options).unwrap();
    for i in 0..TASKS {
        let id = format!("{i:02}");
        timers.schedule(&id, id.as_bytes(), due_of(i)).unwrap();
    }
    timers.close().unwrap();
    let segment = segment_of(dir, t0());
    let record = len(&segment) / u64::from(TASKS);
    assert_eq!(len(&segment), record * u64::from(TASKS));
    (segment, record)
}

/// Reopens `dir` with the clock past every task of [`tasks_in_one_segment`] and returns
/// those of them (among the first `upto`) not delivered, but task 5.
fn lost_but_task_five(dir: &Path, upto: u32) -> Vec<String> {
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir, options).unwrap();
    let rx = collect(&timers, |_, _| false);
    clock.set(due_of(TASKS) + MIN);
    let mut got = HashSet::new();
    while let Ok(s) = rx.recv_timeout(Duration::from_millis(1500)) {
        got.insert(s.id);
    }
    timers.close().unwrap();
    (0..upto)
        .filter(|&i| i != 5)
        .map(|i| format!("{i:02}"))
        .filter(|id| !got.contains(id))
        .collect()
}

/// Bit rot inside a segment, not at its end: the damaged record is lost, but every record
/// after it is still read and delivered, the file is not cut, and the damage is counted.
#[test]
fn flipped_bytes_inside_a_segment_lose_only_the_damaged_record() {
    let dir = tempfile::tempdir().unwrap();
    let (n, due) = (TASKS, due_of);
    let (segment, record) = tasks_in_one_segment(dir.path());
    // Two bytes of record 5's body, as bit rot flips them.
    flip_two_bytes(&segment, 5 * record + record / 2);

    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    let mut seen = HashMap::new();
    for i in (0..n).filter(|&i| i != 5) {
        clock.set(due(i));
        let s = next(&rx);
        assert!(s.due <= clock.now(), "{} early", s.id);
        assert_eq!(s.payload, s.id.as_bytes(), "payload of {}", s.id);
        *seen.entry(s.id).or_insert(0) += 1;
    }
    clock.set(due(n) + MIN);
    quiet(&rx, 300);
    let expected: HashSet<String> = (0..n)
        .filter(|&i| i != 5)
        .map(|i| format!("{i:02}"))
        .collect();
    assert_eq!(seen.keys().cloned().collect::<HashSet<_>>(), expected);
    assert!(
        seen.values().all(|&c| c == 1),
        "each delivered once: {seen:?}"
    );
    assert!(timers.damaged_spans() >= 1, "the damage was not counted");
    assert_eq!(len(&segment), record * u64::from(n), "the segment was cut");
    timers.close().unwrap();
}

/// Set in the environment of the child process of the full-disk test: the directory it
/// writes to.
const CHILD_DIR: &str = "CWD_FULL_DISK_CHILD_DIR";
/// Bytes any file of the child may grow to (`ulimit -f`, in 512-byte blocks).
const FILE_LIMIT_BLOCKS: u64 = 128;

/// The child half of [`a_write_past_the_file_size_limit_fails_its_call_and_harms_nothing_acked`]:
/// a no-op unless that test started it. Schedules 1 KiB tasks one call each and reports on
/// stdout which calls returned `Ok` (`@@A <id>`) and which an error (`@@E <id> <error>`).
#[test]
fn full_disk_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let timers = DurableTimers::open(&dir, Options::default()).unwrap();
    let due = SystemTime::now() + Duration::from_secs(3600);
    let mut out = std::io::stdout().lock();
    for i in 0..200u32 {
        let id = format!("t{i:03}");
        match timers.schedule(&id, [i as u8; 1000], due) {
            Ok(()) => writeln!(out, "@@A {id}").unwrap(),
            Err(e @ Error::Io(_)) => writeln!(out, "@@E {id} {e}").unwrap(),
            Err(e) => panic!("{id}: not an I/O error: {e:?}"),
        }
    }
    timers.close().unwrap();
}

/// Runs the test `child` of this binary in a process of its own whose files may grow to
/// [`FILE_LIMIT_BLOCKS`], with `dir` in its environment as `key`; returns its output.
/// RLIMIT_FSIZE, set by the shell for the child alone, makes a write past the limit fail
/// with EFBIG as a full disk fails it with ENOSPC, with no privileges needed. SIGXFSZ is
/// ignored (and stays ignored across exec) so that the write returns the error instead of
/// the signal killing the process.
fn under_file_limit(child: &str, key: &str, dir: &Path) -> std::process::Output {
    let script = format!("trap '' XFSZ; ulimit -f {FILE_LIMIT_BLOCKS} && exec \"$0\" \"$@\"");
    let output = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", child, "--nocapture", "--test-threads=1"])
        .env(key, dir)
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert!(output.status.success(), "child failed: {:?}", output.status);
    output
}

#[test]
fn a_write_past_the_file_size_limit_fails_its_call_and_harms_nothing_acked() {
    let dir = tempfile::tempdir().unwrap();
    let output = under_file_limit("full_disk_child", CHILD_DIR, dir.path());
    let (mut acked, mut failed) = (HashSet::new(), HashSet::new());
    for line in BufReader::new(output.stdout.as_slice()).lines() {
        let line = line.unwrap();
        // The test harness may print on the same line before the child's first report.
        let Some(at) = line.find("@@") else { continue };
        let mut words = line[at + 2..].split_whitespace();
        match (words.next(), words.next()) {
            (Some("A"), Some(id)) => acked.insert(id.to_string()),
            (Some("E"), Some(id)) => failed.insert(id.to_string()),
            _ => continue,
        };
    }
    // 200 KB of tasks against 64 KiB a file: calls fail each time a segment is full, and
    // the journal carries on in a new segment.
    assert!(!failed.is_empty(), "no call failed");
    assert!(acked.len() > 100, "only {} calls succeeded", acked.len());
    assert_eq!(acked.len() + failed.len(), 200);

    // Reopened without the limit, every acknowledged task is there, payload intact.
    let clock = Arc::new(ManualWallClock::new(
        SystemTime::now() + Duration::from_secs(7200),
    ));
    let timers = DurableTimers::open(dir.path(), Options::default().clock(clock)).unwrap();
    let rx = collect(&timers, |_, _| false);
    let mut seen = HashSet::new();
    while !acked.is_subset(&seen) {
        let s = next(&rx);
        let i: u8 = s.id[1..].parse::<u32>().unwrap() as u8;
        assert_eq!(s.payload, vec![i; 1000], "payload of {}", s.id);
        assert!(acked.contains(&s.id) || failed.contains(&s.id), "{}", s.id);
        seen.insert(s.id);
    }
    while let Ok(s) = rx.recv_timeout(Duration::from_millis(200)) {
        assert!(
            failed.contains(&s.id),
            "{} delivered twice or unknown",
            s.id
        );
        seen.insert(s.id);
    }
    eprintln!(
        "full disk: {} calls acknowledged, {} failed with an I/O error; {} of those delivered",
        acked.len(),
        failed.len(),
        failed.intersection(&seen).count()
    );
    timers.close().unwrap();
}

/// Bit rot in the first of 20 Done marks: only the task whose mark is damaged may be
/// delivered again; the 19 marks after it are still read.
#[test]
fn corruption_of_one_done_mark_does_not_redeliver_every_later_acked_task() {
    let dir = tempfile::tempdir().unwrap();
    let n: u32 = 20;
    let due = |i: u32| t0() + 10 * MIN + Duration::from_secs(i.into());
    {
        let (_clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        for i in 0..n {
            timers.schedule(format!("t{i:02}"), b"", due(i)).unwrap();
        }
        timers.close().unwrap();
    }
    let tasks_segment = segment_of(dir.path(), t0());
    {
        // Second open: deliver and ack all 20 one at a time (one Done mark per commit),
        // staying inside the bucket's hour so the bucket is not deleted.
        let (clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        let rx = collect(&timers, |_, _| false);
        for i in 0..n {
            clock.set(due(i));
            assert_eq!(next(&rx).id, format!("t{i:02}"));
        }
        std::thread::sleep(Duration::from_millis(300));
        timers.close().unwrap();
    }
    let folder = tasks_segment.parent().unwrap().to_path_buf();
    let marks: Vec<PathBuf> = fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| *p != tasks_segment)
        .collect();
    assert_eq!(marks.len(), 1, "one segment of Done marks");
    let record = len(&marks[0]) / u64::from(n);
    assert_eq!(len(&marks[0]), record * u64::from(n));
    flip_two_bytes(&marks[0], record / 2);

    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).expect("open reads past the damage");
    let rx = collect(&timers, |_, _| false);
    clock.set(due(n));
    let mut again: Vec<String> = Vec::new();
    while let Ok(s) = rx.recv_timeout(Duration::from_millis(1500)) {
        again.push(s.id);
    }
    again.sort();
    // Only t00, whose own mark is damaged, may come again.
    assert!(
        again.len() <= 1,
        "acked tasks delivered again after one damaged Done mark: {again:?}"
    );
}

/// One unreadable segment (here a folder where a segment file should be; an EIO from a bad
/// sector takes the same path) in an old bucket: that bucket is read again later, and the
/// others, a task scheduled now among them, are delivered meanwhile.
#[test]
fn one_unreadable_bucket_does_not_stop_every_other_bucket() {
    let dir = tempfile::tempdir().unwrap();
    {
        let timers = DurableTimers::open(dir.path(), Options::default()).unwrap();
        timers.close().unwrap();
    }
    // An old bucket (1970) with a segment that cannot be read.
    fs::create_dir_all(dir.path().join("buckets/3600000/0000000001-000000.seg")).unwrap();
    let timers =
        DurableTimers::open(dir.path(), Options::default()).expect("open reads past the damage");
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    timers
        .run_handler(1, move |task| {
            let _ = tx.lock().unwrap().send(task.id().to_vec());
            Ok::<(), String>(())
        })
        .unwrap();
    timers
        .schedule("now", b"", SystemTime::now() + Duration::from_millis(100))
        .unwrap();
    let got = rx.recv_timeout(Duration::from_secs(5));
    assert_eq!(
        got.ok(),
        Some(b"now".to_vec()),
        "a task due in 100 ms was not delivered within 5 s"
    );
    drop(timers);
}

/// Bit rot in the 4th of 20 cancel tombstones in the control log: only the task whose
/// tombstone is damaged may come back; the 16 cancels after it still hold.
#[test]
fn corruption_mid_control_log_does_not_resurrect_later_cancelled_tasks() {
    fourth_tombstone_damaged_leaves_the_other_cancels(|control, record| {
        flip_two_bytes(control, 3 * record + record / 2);
    });
}

/// Schedules tasks "c00" to "c19" two hours out and cancels each (20 tombstones of one
/// size in one control segment), lets `damage` harm the fourth (given the segment and a
/// tombstone's length), reopens, and checks that only "c03" may be delivered.
fn fourth_tombstone_damaged_leaves_the_other_cancels(damage: impl FnOnce(&Path, u64)) {
    let dir = tempfile::tempdir().unwrap();
    let n: u32 = 20;
    let due = |i: u32| t0() + 2 * 60 * MIN + Duration::from_secs(i.into());
    {
        let (_clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        for i in 0..n {
            timers.schedule(format!("c{i:02}"), b"", due(i)).unwrap();
        }
        for i in 0..n {
            timers.cancel(format!("c{i:02}")).unwrap();
        }
        timers.close().unwrap();
    }
    let control: Vec<PathBuf> = fs::read_dir(dir.path().join("control"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(control.len(), 1);
    let record = len(&control[0]) / u64::from(n);
    assert_eq!(len(&control[0]), record * u64::from(n));
    damage(&control[0], record);

    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).expect("open reads past the damage");
    let rx = collect(&timers, |_, _| false);
    clock.set(due(n));
    let mut got: Vec<String> = Vec::new();
    while let Ok(s) = rx.recv_timeout(Duration::from_millis(1500)) {
        got.push(s.id);
    }
    got.sort();
    timers.close().unwrap();
    // c03's own tombstone is the damaged one; nothing else may come.
    assert!(
        got.iter().all(|id| id == "c03"),
        "cancelled tasks delivered: {got:?}"
    );
}

/// An upsert's two writes, its new task record and then the tombstone of the old version
/// in the control log, cut between them as a crash can: the upsert is rolled back, and
/// only the old version is delivered. With the tombstone there, only the new one is.
#[test]
fn an_upsert_whose_tombstone_a_crash_cut_off_leaves_only_the_old_version() {
    let old_due = t0() + 10 * MIN;
    // The new version in another (hour-wide) bucket, and in the old version's own.
    for (minutes, cut) in [(120, true), (120, false), (20, true), (20, false)] {
        let new_due = t0() + minutes * MIN;
        let dir = tempfile::tempdir().unwrap();
        {
            let (_clock, options) = manual();
            let timers = DurableTimers::open(dir.path(), options).unwrap();
            timers.schedule("x", b"old", old_due).unwrap();
            timers.schedule("x", b"new", new_due).unwrap();
            timers.close().unwrap();
        }
        let control: Vec<PathBuf> = fs::read_dir(dir.path().join("control"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(control.len(), 1, "one control segment");
        assert!(len(&control[0]) > 0, "the upsert wrote a tombstone");
        if cut {
            OpenOptions::new()
                .write(true)
                .open(&control[0])
                .unwrap()
                .set_len(0)
                .unwrap();
        }
        let (clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        let rx = collect(&timers, |_, _| false);
        clock.set(new_due + MIN);
        let first = next(&rx);
        quiet(&rx, 300);
        let expected: &[u8] = if cut { b"old" } else { b"new" };
        assert_eq!(first.payload, expected, "cut: {cut}, new due {minutes} min");
        timers.close().unwrap();
    }
}

/// A finished bucket whose folder cannot be deleted stays on disk, and the tombstone of a
/// task cancelled in it is kept until it can be: after the next reopens the cancelled
/// task does not come back.
#[test]
fn a_bucket_that_cannot_be_deleted_keeps_its_cancelled_task_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let trash = dir.path().join("trash");
    cancel_a_task_in_the_first_bucket(dir.path());
    {
        // The bucket is finished once loaded (its one task is cancelled) and past; a file
        // where the trash folder should be makes its deletion fail.
        let (clock, options) = manual();
        clock.set(t0() + 180 * MIN);
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        fs::remove_dir_all(&trash).unwrap();
        fs::write(&trash, b"").unwrap();
        let rx = collect(&timers, |_, _| false);
        quiet(&rx, 500);
        timers.close().unwrap();
        fs::remove_file(&trash).unwrap();
    }
    the_cancelled_task_stays_gone(dir.path());
}

/// Schedules "gone" into the bucket at t0, cancels it and closes: that bucket is finished
/// once it is loaded and past.
fn cancel_a_task_in_the_first_bucket(dir: &Path) {
    let (_clock, options) = manual();
    let timers = DurableTimers::open(dir, options).unwrap();
    timers.schedule("gone", b"", t0() + 10 * MIN).unwrap();
    timers.cancel("gone").unwrap();
    timers.close().unwrap();
}

/// Opens `dir` at t0 + 3 h, with the first bucket past: "gone", cancelled there, is not
/// delivered.
fn the_cancelled_task_stays_gone(dir: &Path) {
    let (clock, options) = manual();
    clock.set(t0() + 180 * MIN);
    let timers = DurableTimers::open(dir, options).unwrap();
    let rx = collect(&timers, |_, _| false);
    if let Ok(s) = rx.recv_timeout(Duration::from_millis(1000)) {
        panic!(
            "cancelled task delivered after reopen: {s:?}; bucket still on disk: {}",
            bucket_dir(dir, t0()).exists()
        );
    }
    timers.close().unwrap();
}

/// One flipped bit in the length field of a record in the middle of a segment (bit 16, so
/// the length stays in range but runs past the end of a small file): not taken for a torn
/// tail; only that record is lost, and every acknowledged record after it is delivered.
#[test]
fn a_flipped_length_bit_mid_segment_loses_only_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let n = TASKS;
    let (segment, record) = tasks_in_one_segment(dir.path());
    {
        // Byte 2 of record 5's little-endian length: +65,536, still below MAX_BODY.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&segment)
            .unwrap();
        let at = 5 * record + 2;
        let mut byte = [0u8; 1];
        file.seek(SeekFrom::Start(at)).unwrap();
        file.read_exact(&mut byte).unwrap();
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(&[byte[0] ^ 0x01]).unwrap();
    }
    let lost = lost_but_task_five(dir.path(), n);
    let seg_len = len(&segment);
    assert!(
        lost.is_empty(),
        "acknowledged tasks after the damaged record lost: {lost:?}; segment now {seg_len} of {} bytes",
        record * u64::from(n)
    );
}

const UPSERT_CHILD_DIR: &str = "CWD_UPSERT_CHILD_DIR";

/// Child of `an_upsert_whose_tombstone_write_fails_leaves_the_old_version`: under a
/// 64 KiB file-size limit, an upsert of x whose task record is written and fsynced and
/// whose tombstone's write fails ([`upsert_x_past_the_file_limit`]), then a close.
#[test]
fn upsert_full_disk_child() {
    let Some(dir) = std::env::var_os(UPSERT_CHILD_DIR) else {
        return;
    };
    let (_clock, timers) = upsert_x_past_the_file_limit(&PathBuf::from(dir));
    timers.close().unwrap();
}

/// For a child under [`FILE_LIMIT_BLOCKS`]: opens `dir` on a manual clock, schedules x
/// (a 1000-byte id, acked) into the bucket at t0 + 3 h, fills the control segment with
/// tombstones to just under the limit, then upserts x into the same bucket, whose
/// tombstone's write fails (EFBIG, as ENOSPC would). Prints `@@U ok` or `@@U err`.
fn upsert_x_past_the_file_limit(dir: &Path) -> (Arc<ManualWallClock>, DurableTimers) {
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir, options).unwrap();
    let x = "x".repeat(1000);
    timers.schedule(&x, b"old", t0() + 180 * MIN).unwrap();
    let filler = "f".repeat(1000);
    timers.schedule(&filler, b"", t0() + 300 * MIN).unwrap();
    let control_len = || -> u64 {
        fs::read_dir(dir.join("control"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .max()
            .unwrap_or(0)
    };
    let tomb = 8 + 23 + 1000;
    while control_len() + tomb <= FILE_LIMIT_BLOCKS * 512 {
        timers.cancel(&filler).unwrap();
    }
    let r = timers.schedule(&x, b"new", t0() + 200 * MIN);
    println!("@@U {}", if r.is_ok() { "ok" } else { "err" });
    (clock, timers)
}

/// A write that fails in the second phase of a group commit (the tombstone of an upsert, on
/// a full disk) returns an error to the upsert's caller and loses nothing: the old,
/// acknowledged version of x is delivered after a reopen.
#[test]
fn an_upsert_whose_tombstone_write_fails_leaves_the_old_version() {
    let dir = tempfile::tempdir().unwrap();
    let output = under_file_limit("upsert_full_disk_child", UPSERT_CHILD_DIR, dir.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("@@U err"),
        "the upsert was meant to fail its tombstone write: {stdout}"
    );
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    clock.set(t0() + 4 * 60 * MIN);
    let got = rx.recv_timeout(Duration::from_secs(3));
    let got = got
        .expect("x, acknowledged before the failed upsert, was lost (neither version delivered)");
    assert!(got.id.starts_with('x'));
    timers.close().unwrap();
}

/// A bucket whose read failed is read again a second later by the monotonic clock: after
/// a backwards step of the wall clock (5 min here), an overdue task in it whose read now
/// succeeds is delivered within seconds, not after the step.
#[test]
fn a_failed_bucket_is_read_again_after_a_second_even_if_the_clock_steps_back() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        timers.schedule("a", b"", t0() + 10 * MIN).unwrap();
        timers.close().unwrap();
    }
    let ms = t0()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // A segment that cannot be read (a folder), in the same bucket as "a".
    let bad = dir
        .path()
        .join(format!("buckets/{ms}/0000000001-000099.seg"));
    fs::create_dir_all(&bad).unwrap();
    let clock = Arc::new(ManualWallClock::new(t0() + 20 * MIN));
    let timers = DurableTimers::open(dir.path(), Options::default().clock(clock.clone())).unwrap();
    let rx = collect(&timers, |_, _| false);
    // The loader tries the bucket and fails.
    std::thread::sleep(Duration::from_millis(500));
    assert!(rx.try_recv().is_err());
    // The fault clears, and the clock is stepped back 5 min ("a" is still overdue).
    fs::remove_dir(&bad).unwrap();
    clock.set(t0() + 15 * MIN);
    let got = rx.recv_timeout(Duration::from_secs(4));
    timers.close().unwrap();
    assert_eq!(
        got.map(|s| s.id).ok().as_deref(),
        Some("a"),
        "an overdue task of a bucket that became readable was not delivered within 4 s"
    );
}

/// `corruption_mid_control_log_does_not_resurrect_later_cancelled_tasks` with the flipped
/// bit in the length field of the 4th tombstone (bit 16: still in range, past the end of
/// the file): the 16 cancels after it still hold.
#[test]
fn a_flipped_length_bit_mid_control_log_does_not_resurrect_later_cancels() {
    fourth_tombstone_damaged_leaves_the_other_cancels(|control, record| {
        // Byte 2 of the little-endian length: +65,536, still below the largest body.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(control)
            .unwrap();
        let at = 3 * record + 2;
        let mut byte = [0u8; 1];
        file.seek(SeekFrom::Start(at)).unwrap();
        file.read_exact(&mut byte).unwrap();
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(&[byte[0] ^ 0x01]).unwrap();
    });
}

/// Upserts into the old version's bucket, a failing handler's retries to a dead letter, a
/// requeue (an upsert of a dead letter), with a restart between each step: the newest
/// version is delivered, once, each time.
#[test]
fn upserts_retries_and_requeues_across_restarts_deliver_the_newest_once() {
    use corewheel_durable::RetryPolicy;
    let dir = tempfile::tempdir().unwrap();
    let options = |clock: &Arc<ManualWallClock>| {
        Options::default().clock(clock.clone()).retry(RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_secs(1),
            multiplier: 1,
            max_backoff: Duration::from_secs(1),
        })
    };
    let clock = Arc::new(ManualWallClock::new(t0()));
    {
        let timers = DurableTimers::open(dir.path(), options(&clock)).unwrap();
        timers.schedule("x", b"v1", t0() + 10 * MIN).unwrap();
        timers.schedule("x", b"v2", t0() + 20 * MIN).unwrap();
        timers.close().unwrap();
    }
    {
        let timers = DurableTimers::open(dir.path(), options(&clock)).unwrap();
        timers.schedule("x", b"v3", t0() + 30 * MIN).unwrap();
        std::thread::sleep(Duration::from_millis(300)); // housekeeping prunes
        timers.close().unwrap();
    }
    {
        let timers = DurableTimers::open(dir.path(), options(&clock)).unwrap();
        let rx = collect(&timers, |_, _| true);
        clock.set(t0() + 30 * MIN);
        let s = next(&rx);
        assert_eq!((s.payload.as_slice(), s.attempt), (&b"v3"[..], 1));
        std::thread::sleep(Duration::from_millis(300)); // the failure is committed at 30 min
        clock.set(t0() + 32 * MIN);
        let s = next(&rx);
        assert_eq!((s.payload.as_slice(), s.attempt), (&b"v3"[..], 2));
        quiet(&rx, 300);
        common::eventually(|| timers.dead_letters().len() == 1);
        timers.close().unwrap();
    }
    {
        let timers = DurableTimers::open(dir.path(), options(&clock)).unwrap();
        assert_eq!(timers.dead_letters().len(), 1);
        timers.requeue("x").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        timers.close().unwrap();
    }
    {
        let timers = DurableTimers::open(dir.path(), options(&clock)).unwrap();
        assert!(timers.dead_letters().is_empty());
        let rx = collect(&timers, |_, _| false);
        clock.set(t0() + 40 * MIN);
        let s = next(&rx);
        assert_eq!((s.payload.as_slice(), s.attempt), (&b"v3"[..], 1));
        quiet(&rx, 500);
        timers.close().unwrap();
    }
    let timers = DurableTimers::open(dir.path(), options(&clock)).unwrap();
    let rx = collect(&timers, |_, _| false);
    clock.set(t0() + 3 * 60 * MIN);
    quiet(&rx, 500);
    timers.close().unwrap();
}

/// A segment that a crash left with a torn last record (every segment being written at a
/// crash is) and that later gets bit rot in the middle: only the damaged record and the
/// torn one are lost.
#[test]
fn bit_rot_in_a_segment_with_a_torn_tail_loses_only_the_damaged_and_torn_records() {
    let dir = tempfile::tempdir().unwrap();
    let n = TASKS;
    let (segment, record) = tasks_in_one_segment(dir.path());
    // The crash tore the last record (never acknowledged)...
    OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len(&segment) - record / 2)
        .unwrap();
    // ...and bit rot later hit record 5's body.
    flip_two_bytes(&segment, 5 * record + record / 2);

    // The torn one, the last, was never acknowledged.
    let lost = lost_but_task_five(dir.path(), n - 1);
    assert!(lost.is_empty(), "acknowledged tasks lost: {lost:?}");
}

/// A finished bucket whose deletion failed is not deleted by the writer's next try once a
/// task acknowledged in between was written into it: the task is still there after a
/// reopen.
#[test]
fn a_retried_bucket_deletion_spares_a_task_scheduled_into_it_after_the_first_failure() {
    let dir = tempfile::tempdir().unwrap();
    let trash = dir.path().join("trash");
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    // Bucket t0 holds one task, cancelled: finished as soon as its span is past.
    timers.schedule("gone", b"", t0() + 10 * MIN).unwrap();
    timers.cancel("gone").unwrap();
    // Deleting it fails: a file stands where the trash folder should be.
    fs::remove_dir_all(&trash).unwrap();
    fs::write(&trash, b"").unwrap();
    clock.set(t0() + 70 * MIN);
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        bucket_dir(dir.path(), t0()).exists(),
        "precondition: the bucket's deletion failed"
    );
    // A task due in that (past) bucket's span, acknowledged; no handler runs yet.
    timers.schedule("kept", b"p", t0() + 30 * MIN).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // The disk recovers: the writer's retry now renames the whole folder away.
    fs::remove_file(&trash).unwrap();
    fs::create_dir(&trash).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    timers.close().unwrap();

    let (clock, options) = manual();
    clock.set(t0() + 70 * MIN);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let rx = collect(&timers, |_, _| false);
    let got = rx.recv_timeout(Duration::from_secs(3));
    assert!(
        got.as_ref().is_ok_and(|s| s.id == "kept"),
        "the acknowledged schedule of \"kept\" was lost after a reopen: got {got:?}"
    );
    timers.close().unwrap();
}

const DEAD_CHILD_DIR: &str = "CWD_DEAD_LETTER_CHILD_DIR";

/// Child of `a_dead_letter_whose_done_mark_write_failed_once_is_not_doubled_by_a_reopen`:
/// "x" (a 1000-byte id) fails its only attempt while its bucket's segment is too full for
/// its Done mark (a second-phase write) but the dead-letter log has room for its dead
/// letter (a first-phase write). The writer keeps the outcome and commits it again.
#[test]
fn dead_letter_full_disk_child() {
    let Some(dir) = std::env::var_os(DEAD_CHILD_DIR) else {
        return;
    };
    let (clock, options) = manual();
    let options = options.retry(one_attempt());
    let timers = DurableTimers::open(&dir, options).unwrap();
    let x = "x".repeat(1000);
    timers.schedule(&x, b"", t0() + SEC).unwrap();
    // 1,031 bytes of x, then a filler up to 65,000 bytes: x's Done mark (1,031 bytes) no
    // longer fits under the 65,536-byte limit.
    timers
        .schedule("f", vec![0u8; 65_000 - 1031 - 32], t0() + 50 * MIN)
        .unwrap();
    let _rx = collect(&timers, |id, _| id != "f");
    clock.set(t0() + 2 * SEC);
    common::eventually(|| !timers.dead_letters().is_empty());
    std::thread::sleep(Duration::from_millis(500));
    println!("@@DEAD {}", timers.dead_letters().len());
    timers.close().unwrap();
}

/// A task that failed its last attempt is one dead letter while the process runs, and
/// still one after a reopen, though a failed second-phase write (the Done mark) made the
/// writer commit the outcome again after the first commit's dead letter was durable.
#[test]
fn a_dead_letter_whose_done_mark_write_failed_once_is_not_doubled_by_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let out = under_file_limit("dead_letter_full_disk_child", DEAD_CHILD_DIR, dir.path());
    let out = String::from_utf8_lossy(&out.stdout);
    let before: usize = out
        .lines()
        .find_map(|l| {
            l.find("@@DEAD ")
                .map(|at| l[at + 7..].trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("child reported nothing: {out}"));
    assert_eq!(before, 1, "in the child, one dead letter");
    let (clock, options) = manual();
    clock.set(t0() + 2 * SEC);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let after = timers.dead_letters();
    assert_eq!(
        after.len(),
        before,
        "the child listed {before} dead letter(s) for x, the reopened store lists {}",
        after.len()
    );
    timers.close().unwrap();
}

const LOAD_AFTER_FAILED_UPSERT_DIR: &str = "CWD_LOAD_AFTER_FAILED_UPSERT_DIR";

/// Child of `an_upsert_whose_tombstone_write_failed_does_not_hide_the_old_version_in_this_process`:
/// the same failed upsert ([`upsert_x_past_the_file_limit`]); nothing else is committed,
/// then x's bucket comes due in this process. Prints what was delivered (`@@X`).
#[test]
fn upsert_fails_then_bucket_loads_child() {
    let Some(dir) = std::env::var_os(LOAD_AFTER_FAILED_UPSERT_DIR) else {
        return;
    };
    let (clock, timers) = upsert_x_past_the_file_limit(&PathBuf::from(dir));
    let rx = collect(&timers, |_, _| false);
    clock.set(t0() + 210 * MIN);
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(s) => println!("@@X {}", String::from_utf8_lossy(&s.payload)),
        Err(_) => println!("@@X none"),
    }
    timers.close().unwrap();
}

/// An upsert whose tombstone write fails returns an error and leaves the old, acknowledged
/// version, in the same process too: its bucket, loaded before any later commit succeeds,
/// delivers the old version (the failed commit's record on disk does not hide it).
#[test]
fn an_upsert_whose_tombstone_write_failed_does_not_hide_the_old_version_in_this_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = under_file_limit(
        "upsert_fails_then_bucket_loads_child",
        LOAD_AFTER_FAILED_UPSERT_DIR,
        dir.path(),
    );
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains("@@U err"),
        "precondition: the upsert failed: {out}"
    );
    assert!(
        out.contains("@@X old"),
        "x's acknowledged version was not delivered when due (the failed upsert hid it): {}",
        out.lines()
            .filter(|l| l.contains("@@"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// A finished bucket is renamed into `trash/` to delete it; with `trash/` removed by
/// someone, it is made again, so the bucket is really deleted and the task cancelled in
/// it, whose tombstone is then pruned, does not come back at the next open.
#[test]
fn a_missing_trash_folder_does_not_let_a_cancelled_task_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let trash = dir.path().join("trash");
    cancel_a_task_in_the_first_bucket(dir.path());
    {
        let (clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options).unwrap();
        fs::remove_dir_all(&trash).unwrap();
        clock.set(t0() + 180 * MIN);
        std::thread::sleep(Duration::from_millis(600));
        timers.close().unwrap();
    }
    the_cancelled_task_stays_gone(dir.path());
}

const REQUEUE_CHILD_DIR: &str = "CWD_REQUEUE_CHILD_DIR";

/// Opens `dir` on a manual clock, where `x` fails its only attempt (due t0 + 1 s) and its
/// bucket is deleted, then closes it: a later open knows x only as a dead letter. Returns
/// the clock (at t0 + 2 h) and the options, without the retry policy.
fn x_dies_and_its_bucket_goes(dir: &Path, x: &str) -> (Arc<ManualWallClock>, Options) {
    let (clock, options) = manual();
    let timers = DurableTimers::open(dir, options.clone().retry(one_attempt())).unwrap();
    timers.schedule(x, b"x", t0() + SEC).unwrap();
    let _rx = collect(&timers, |_, _| true);
    clock.set(t0() + 120 * MIN);
    common::eventually(|| !bucket_dir(dir, t0()).exists());
    timers.close().unwrap();
    (clock, options)
}

/// Child of `a_requeue_whose_mark_write_fails_runs_its_task_once_and_hides_its_letter`:
/// under [`FILE_LIMIT_BLOCKS`], x (a 100-byte id) dies and its bucket is deleted; after a
/// reopen (which knows x only as a dead letter), y's dead letter fills this open's
/// dead-letter segment so that the write of x's requeue mark fails after its task and
/// tombstone are durable. Prints `@@R ok|err` for the requeue, then whether x was
/// delivered within 2 s (`@@X yes|no`) and is still listed (`@@L yes|no`).
#[test]
fn requeue_full_disk_child() {
    let Some(dir) = std::env::var_os(REQUEUE_CHILD_DIR) else {
        return;
    };
    let x = "x".repeat(100);
    let (clock, options) = x_dies_and_its_bucket_goes(Path::new(&dir), &x);
    let timers = DurableTimers::open(&dir, options.retry(one_attempt())).unwrap();
    // y's dead letter (32 + 65,400 bytes) leaves room for y's Done mark (32 bytes) in its
    // bucket but not for x's requeue mark (131 bytes) in the dead-letter segment.
    timers
        .schedule("y", vec![7u8; 65_400], t0() + 120 * MIN + SEC)
        .unwrap();
    let rx = collect(&timers, |id, _| id == "y");
    clock.set(t0() + 121 * MIN);
    common::eventually(|| timers.dead_letters().len() == 2);
    let _ = rx.try_iter().count();
    clock.set(t0() + 180 * MIN);
    let r = timers.requeue(&x);
    println!("@@R {}", if r.is_ok() { "ok" } else { "err" });
    let delivered = rx.recv_timeout(Duration::from_secs(2)).is_ok();
    println!("@@X {}", if delivered { "yes" } else { "no" });
    let listed = timers.dead_letters().iter().any(|t| t.id() == x.as_bytes());
    println!("@@L {}", if listed { "yes" } else { "no" });
    timers.close().unwrap();
}

/// A requeue whose mark cannot be written (a full disk) after its task and tombstone
/// are durable: the task runs once, and its dead letter is listed neither in this
/// process nor after a reopen (the tombstone stands for the mark until it is written).
/// Before, the letter stayed listed beside a task that ran, so a second requeue ran it
/// twice.
#[test]
fn a_requeue_whose_mark_write_fails_runs_its_task_once_and_hides_its_letter() {
    let dir = tempfile::tempdir().unwrap();
    let out = under_file_limit("requeue_full_disk_child", REQUEUE_CHILD_DIR, dir.path());
    let out = String::from_utf8_lossy(&out.stdout);
    let said = |what: &str| {
        out.lines()
            .find_map(|l| {
                l.find(what)
                    .map(|at| l[at + what.len()..].trim().to_string())
            })
            .unwrap_or_else(|| panic!("child said nothing for {what}: {out}"))
    };
    assert_eq!(
        said("@@R "),
        "ok",
        "the requeue's task and tombstone were durable"
    );
    assert_eq!(said("@@X "), "yes", "x was not delivered after its requeue");
    assert_eq!(said("@@L "), "no", "x ran and is still a dead letter");
    let (clock, options) = manual();
    clock.set(t0() + 181 * MIN);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let x = "x".repeat(100);
    assert!(
        !timers.dead_letters().iter().any(|t| t.id() == x.as_bytes()),
        "after a reopen, x (which ran) is a dead letter again"
    );
    let rx = collect(&timers, |_, _| false);
    quiet(&rx, 1000);
    timers.close().unwrap();
}

/// A kill between a requeue's two writes (its task and tombstone written, its requeue
/// mark not, made here by cutting the mark off the dead-letter log): the next open lists
/// no dead letter for x and delivers x, and writes the mark again, so that the letter
/// stays gone once the tombstone is pruned (made here by removing the control log).
#[test]
fn a_requeue_whose_mark_a_crash_cut_off_is_finished_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let x = "x".repeat(100);
    let (_clock, options) = x_dies_and_its_bucket_goes(dir.path(), &x);
    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    timers.requeue(&x).unwrap();
    timers.close().unwrap();
    let mark_len = 8 + 23 + x.len() as u64;
    let marks: Vec<PathBuf> = fs::read_dir(dir.path().join("dead"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| len(p) == mark_len)
        .collect();
    assert_eq!(marks.len(), 1, "one segment holding the requeue mark alone");
    OpenOptions::new()
        .write(true)
        .open(&marks[0])
        .unwrap()
        .set_len(0)
        .unwrap();

    let timers = DurableTimers::open(dir.path(), options.clone()).unwrap();
    assert!(timers.dead_letters().is_empty(), "x requeued and listed");
    let rx = collect(&timers, |_, _| false);
    assert_eq!(next(&rx).id, x);
    quiet(&rx, 300);
    timers.close().unwrap();
    fs::remove_dir_all(dir.path().join("control")).unwrap();
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    assert!(
        timers.dead_letters().is_empty(),
        "without the requeue's tombstone, x's dead letter came back"
    );
    timers.close().unwrap();
}

/// An open that writes a requeue mark a crash cut off and then rewrites the dead-letter
/// log (1,041 records, none live): a dead letter of that open is kept. Before, the mark's
/// segment left with the old log but stayed open, and later letters went to a deleted file.
#[test]
fn an_open_that_finishes_a_cut_requeue_and_rewrites_the_dead_log_keeps_later_letters() {
    let dir = tempfile::tempdir().unwrap();
    let n = 520;
    let ids: Vec<String> = (0..n).map(|i| format!("d{i:03}")).collect();
    {
        let (clock, options) = manual();
        let timers = DurableTimers::open(dir.path(), options.retry(one_attempt())).unwrap();
        let mut batch: Vec<(String, Vec<u8>, SystemTime)> = ids
            .iter()
            .map(|id| (id.clone(), b"p".to_vec(), t0() + SEC))
            .collect();
        batch.push(("x".into(), b"p".to_vec(), t0() + SEC));
        timers.schedule_batch(batch).unwrap();
        let failed = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let rx = collect(&timers, move |id, _| {
            failed.lock().unwrap().insert(id.to_string())
        });
        clock.set(t0() + 120 * MIN);
        for _ in 0..=n {
            rx.recv_timeout(Duration::from_secs(30)).unwrap();
        }
        common::eventually(|| timers.dead_letters().len() == n + 1);
        for id in &ids {
            timers.requeue(id).unwrap();
        }
        timers.requeue("x").unwrap();
        for _ in 0..=n {
            rx.recv_timeout(Duration::from_secs(30)).unwrap();
        }
        quiet(&rx, 300);
        timers.close().unwrap();
    }
    let segments: Vec<PathBuf> = fs::read_dir(dir.path().join("dead"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(segments.len(), 1);
    let mark_len = 8 + 23 + 1;
    let bytes = fs::read(&segments[0]).unwrap();
    let last = &bytes[bytes.len() - mark_len..];
    assert_eq!(
        (last[8], last[mark_len - 1]),
        (5, b'x'),
        "x's requeue mark last"
    );
    OpenOptions::new()
        .write(true)
        .open(&segments[0])
        .unwrap()
        .set_len((bytes.len() - mark_len) as u64)
        .unwrap();

    let (clock, options) = manual();
    clock.set(t0() + 200 * MIN);
    {
        let timers = DurableTimers::open(dir.path(), options.clone().retry(one_attempt())).unwrap();
        assert!(timers.dead_letters().is_empty());
        timers.schedule("y", b"y", t0() + 200 * MIN + SEC).unwrap();
        let _rx = collect(&timers, |id, _| id == "y");
        clock.set(t0() + 201 * MIN);
        common::eventually(|| timers.dead_letters().len() == 1);
        timers.close().unwrap();
    }
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    let listed: Vec<Vec<u8>> = timers
        .dead_letters()
        .iter()
        .map(|t| t.id().to_vec())
        .collect();
    assert_eq!(listed, vec![b"y".to_vec()], "y's dead letter was lost");
    timers.close().unwrap();
}

const MARKS_CHILD_DIR: &str = "CWD_MARKS_CHILD_DIR";

/// Child of `a_requeue_mark_that_cannot_be_written_is_retried_quietly_and_finished_by_the_next_open`:
/// opens `dir` (x dead), puts a plain file where the dead-letter folder was, so that no
/// requeue mark can be written, requeues x and runs 3 s more. Prints `@@R ok|err` and
/// whether x was delivered (`@@X yes|no`).
#[test]
fn unwritable_marks_child() {
    let Some(dir) = std::env::var_os(MARKS_CHILD_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let (clock, options) = manual();
    clock.set(t0() + 180 * MIN);
    let timers = DurableTimers::open(&dir, options).unwrap();
    fs::rename(dir.join("dead"), dir.join("dead.away")).unwrap();
    fs::write(dir.join("dead"), b"not a folder").unwrap();
    let rx = collect(&timers, |_, _| false);
    let r = timers.requeue("x");
    println!("@@R {}", if r.is_ok() { "ok" } else { "err" });
    let delivered = rx.recv_timeout(Duration::from_secs(2)).is_ok();
    println!("@@X {}", if delivered { "yes" } else { "no" });
    std::thread::sleep(Duration::from_secs(3));
    timers.close().unwrap();
}

/// A requeue mark that cannot be written at all (the dead-letter folder replaced by a
/// file): the requeue returns, its task runs once, the failure is logged once rather than
/// at every retry, and the next open, with the folder mended, still hides the letter and
/// does not run x again.
#[test]
fn a_requeue_mark_that_cannot_be_written_is_retried_quietly_and_finished_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    x_dies_and_its_bucket_goes(dir.path(), "x");
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unwritable_marks_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(MARKS_CHILD_DIR, dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "child failed: {output:?}");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.contains("@@R ok"), "{out}");
    assert!(out.contains("@@X yes"), "{out}");
    let err = String::from_utf8_lossy(&output.stderr);
    let logged = err.matches("writing requeue marks").count();
    assert_eq!(
        logged, 1,
        "one unwritable mark logged {logged} times in 5 s"
    );
    fs::remove_file(dir.path().join("dead")).unwrap();
    fs::rename(dir.path().join("dead.away"), dir.path().join("dead")).unwrap();
    let (clock, options) = manual();
    clock.set(t0() + 181 * MIN);
    let timers = DurableTimers::open(dir.path(), options).unwrap();
    assert!(
        timers.dead_letters().is_empty(),
        "x ran and is listed again"
    );
    let rx = collect(&timers, |_, _| false);
    quiet(&rx, 500);
    timers.close().unwrap();
}
