//! The audit spool (docs/decisions/0006-audit-spool.md): where the writer
//! puts a batch the store did not take, so that the batch's requests can
//! still be answered, and where it reads the batch back from to replay it
//! into the store once the store answers again.
//!
//! A spool is a directory of append-only JSON-lines files, `audit-<ms>-<n>.jsonl`.
//! Each line is one entry, `{"record": {…}}` (an [`AuditRecord`] in its serde
//! form, the one `capgate audit --json` prints), `{"remembered": {…}}` (a
//! response to remember, its bytes in hex) or `{"lost_answer": {…}}` (a
//! [`LostAnswer`]: what a caller received when the commit of its record lost
//! its answer, docs/decisions/0031; a build before it skips such a line as
//! unreadable).
//! Every append is fsynced before
//! the writer acknowledges it. These names are the format: files a previous
//! build spooled must stay readable.
//!
//! A file is replayed in chunks, and removed once the store has all of it.
//! The store skips decision ids it already holds, so a chunk replayed twice
//! (a crash between the store's commit and the removal) changes nothing.
//!
//! An entry the store refuses for its values (a U+0000 an older build let
//! through) would fail its chunk on every attempt and hold back every file
//! behind it. The writer sets it aside instead: [`Spool::quarantine`] appends
//! it, in the same line format, to `rejected/<the file's name>`, fsynced, and
//! the replay goes on (docs/decisions/0014). Nothing reads `rejected/` again;
//! an operator who mends a line there can move the file back into the spool.
//!
//! The spool reports its backlog to the metrics after every change: the
//! bytes of the files waiting for replay and the instant of the oldest entry
//! among them (a file's name holds the instant it was started).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::store::{AuditRecord, LostAnswer, Remembered};
use crate::telemetry::metrics;

use super::RememberedEntry;

/// Append-only JSON-lines files in one directory. The file being appended to
/// is closed (rotated) before it is replayed, so a file is never appended to
/// and replayed at once; all of it runs in the writer task.
pub(super) struct Spool {
    dir: PathBuf,
    /// The file batches are appended to now.
    current: Option<(PathBuf, File)>,
    /// Closed files waiting for replay, oldest first.
    closed: VecDeque<PathBuf>,
    /// The file being replayed: its entries and how far the store has them.
    replaying: Option<Replay>,
    sequence: u64,
    /// Bytes of every file above: the backlog the metrics report.
    bytes: u64,
}

struct Replay {
    path: PathBuf,
    records: Vec<AuditRecord>,
    remembered: Vec<RememberedEntry>,
    lost: Vec<LostAnswer>,
    next: usize,
    /// Size of the chunk handed out and not yet confirmed.
    taken: usize,
}

/// A chunk to replay, from the spool file `file`.
pub(super) struct Chunk {
    pub(super) file: PathBuf,
    pub(super) records: Vec<AuditRecord>,
    pub(super) remembered: Vec<RememberedEntry>,
    pub(super) lost: Vec<LostAnswer>,
}

const SPOOL_PREFIX: &str = "audit-";
const SPOOL_SUFFIX: &str = ".jsonl";
/// Where entries the store refused are set aside, under the spool directory.
const REJECTED_DIR: &str = "rejected";

impl Spool {
    /// Opens the directory (creating it) and queues the files a previous run
    /// left for replay.
    pub(super) fn open(dir: &Path) -> std::io::Result<Spool> {
        std::fs::create_dir_all(dir)?;
        let mut closed: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with(SPOOL_PREFIX) && name.ends_with(SPOOL_SUFFIX))
            })
            .collect();
        closed.sort();
        if !closed.is_empty() {
            tracing::warn!(files = closed.len(), dir = %dir.display(), "audit spool holds records to replay");
        }
        let mut bytes = 0;
        for path in &closed {
            bytes += std::fs::metadata(path)?.len();
        }
        let spool = Spool {
            dir: dir.to_owned(),
            current: None,
            closed: closed.into(),
            replaying: None,
            sequence: 0,
            bytes,
        };
        spool.report();
        Ok(spool)
    }

    /// Tells the metrics what waits for replay.
    fn report(&self) {
        let oldest = self
            .replaying
            .as_ref()
            .and_then(Replay::oldest_pending)
            .or_else(|| self.closed.front().and_then(|path| started_at(path)))
            .or_else(|| self.current.as_ref().and_then(|(path, _)| started_at(path)));
        metrics().audit_spool(self.bytes, oldest);
    }

    /// Whether anything waits for replay (the file being appended to counts).
    pub(super) fn pending(&self) -> bool {
        self.current.is_some() || !self.closed.is_empty() || self.replaying.is_some()
    }

    /// Appends a batch and fsyncs it.
    pub(super) fn append(
        &mut self,
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
        lost: &[LostAnswer],
    ) -> std::io::Result<()> {
        let mut text = lines(records, remembered)?;
        for lost in lost {
            text.push_str(&serde_json::to_string(&Written::LostAnswer(lost))?);
            text.push('\n');
        }
        if self.current.is_none() {
            self.sequence += 1;
            let name = format!(
                "{SPOOL_PREFIX}{:020}-{:06}{SPOOL_SUFFIX}",
                crate::clock::now().max(0),
                self.sequence
            );
            let path = self.dir.join(name);
            let file = OpenOptions::new().create_new(true).append(true).open(&path)?;
            // The new name must survive a crash too.
            File::open(&self.dir)?.sync_all()?;
            self.current = Some((path, file));
        }
        let Some((_, file)) = &mut self.current else {
            return Ok(());
        };
        file.write_all(text.as_bytes())?;
        file.sync_data()?;
        self.bytes += text.len() as u64;
        self.report();
        Ok(())
    }

    /// Sets entries of the spool file `from` aside, in the spool's line
    /// format, in `rejected/<its name>`, and fsyncs them (the directory too
    /// when it or the file is new). Returns the path they went to.
    pub(super) fn quarantine(
        &self,
        from: &Path,
        records: &[AuditRecord],
        remembered: &[RememberedEntry],
    ) -> std::io::Result<PathBuf> {
        let dir = self.dir.join(REJECTED_DIR);
        if !dir.exists() {
            std::fs::create_dir(&dir)?;
            File::open(&self.dir)?.sync_all()?;
        }
        let name = from
            .file_name()
            .ok_or_else(|| std::io::Error::other(format!("`{}` is not a spool file", from.display())))?;
        let path = dir.join(name);
        let created = !path.exists();
        let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
        file.write_all(lines(records, remembered)?.as_bytes())?;
        file.sync_data()?;
        if created {
            File::open(&dir)?.sync_all()?;
        }
        Ok(path)
    }

    /// The next chunk of at most `size` records to replay, rotating the
    /// current file when nothing older waits.
    pub(super) fn next_chunk(&mut self, size: usize) -> std::io::Result<Option<Chunk>> {
        if self.replaying.is_none() {
            if self.closed.is_empty() {
                if let Some((path, _file)) = self.current.take() {
                    self.closed.push_back(path);
                }
            }
            let Some(path) = self.closed.pop_front() else {
                return Ok(None);
            };
            let (records, remembered, lost) = read_spool_file(&path)?;
            self.replaying = Some(Replay {
                path,
                records,
                remembered,
                lost,
                next: 0,
                taken: 0,
            });
            self.report();
        }
        let Some(replay) = &mut self.replaying else {
            return Ok(None);
        };
        let end = (replay.next + size.max(1)).min(replay.records.len());
        let records = replay.records[replay.next..end].to_vec();
        // Remembered responses and lost answers go with the file's last
        // chunk: by then every record they belong to is in the store.
        let (remembered, lost) = if end == replay.records.len() {
            (replay.remembered.clone(), replay.lost.clone())
        } else {
            (Vec::new(), Vec::new())
        };
        replay.taken = end - replay.next;
        Ok(Some(Chunk {
            file: replay.path.clone(),
            records,
            remembered,
            lost,
        }))
    }

    /// The chunk handed out is in the store. Returns whether that finished
    /// its file (which is then removed).
    pub(super) fn chunk_done(&mut self) -> std::io::Result<bool> {
        let Some(replay) = &mut self.replaying else {
            return Ok(false);
        };
        replay.next += replay.taken;
        replay.taken = 0;
        if replay.next < replay.records.len() {
            self.report();
            return Ok(false);
        }
        let path = replay.path.clone();
        let size = std::fs::metadata(&path)?.len();
        std::fs::remove_file(&path)?;
        File::open(&self.dir)?.sync_all()?;
        self.replaying = None;
        self.bytes = self.bytes.saturating_sub(size);
        self.report();
        Ok(true)
    }
}

impl Replay {
    /// The instant of the oldest entry the store does not have yet.
    fn oldest_pending(&self) -> Option<i64> {
        let records = self.records[self.next..].iter().map(|record| record.at_ms);
        let remembered = self.remembered.iter().map(|(_, _, answer)| answer.at_ms);
        records.chain(remembered).min()
    }
}

/// When a spool file was started: the milliseconds in its name
/// (`audit-<ms>-<n>.jsonl`).
fn started_at(path: &Path) -> Option<i64> {
    path.file_name()?
        .to_str()?
        .strip_prefix(SPOOL_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Entries as spool lines, each ending in a newline.
fn lines(records: &[AuditRecord], remembered: &[RememberedEntry]) -> std::io::Result<String> {
    let mut text = String::new();
    for record in records {
        text.push_str(&serde_json::to_string(&Written::Record(record))?);
        text.push('\n');
    }
    for entry in remembered {
        text.push_str(&serde_json::to_string(&Written::Remembered(
            SpooledResponse::of(entry),
        ))?);
        text.push('\n');
    }
    Ok(text)
}

/// Reads a spool file. A line that does not parse is skipped with a
/// warning: only the last line can be torn (a crash mid-append), and its
/// batch was never acknowledged.
fn read_spool_file(
    path: &Path,
) -> std::io::Result<(Vec<AuditRecord>, Vec<RememberedEntry>, Vec<LostAnswer>)> {
    let reader = BufReader::new(File::open(path)?);
    let mut records = Vec::new();
    let mut remembered = Vec::new();
    let mut lost = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Read>(&line) {
            Ok(Entry::Record(record)) => records.push(record),
            Ok(Entry::Remembered(response)) => remembered.push(response.into_entry()),
            Ok(Entry::LostAnswer(answer)) => lost.push(answer),
            Err(error) => {
                tracing::warn!(
                    file = %path.display(),
                    line = number + 1,
                    %error,
                    "skipping an unreadable spool line"
                );
            }
        }
    }
    Ok((records, remembered, lost))
}

// ── Lines ─────────────────────────────────────────────────────────────────

/// One line of a spool file: serde's externally tagged form is the file's
/// `{"record": …}` / `{"remembered": …}` / `{"lost_answer": …}`. Generic so that
/// lines are written from borrowed records and read into owned ones.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry<R, A, L> {
    Record(R),
    Remembered(A),
    LostAnswer(L),
}

type Written<'a> = Entry<&'a AuditRecord, SpooledResponse, &'a LostAnswer>;
type Read = Entry<AuditRecord, SpooledResponse, LostAnswer>;

/// A response to remember, as a spool line holds it (keys in this order).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SpooledResponse {
    gateway: String,
    request_id: String,
    decision_id: String,
    at_ms: i64,
    #[serde(rename = "response_hex", with = "hex")]
    response: Vec<u8>,
    /// The request's fingerprint (docs/decisions/0027); absent from lines spooled before
    /// fingerprints, whose answer is then no request's.
    #[serde(
        rename = "fingerprint_hex",
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_hex"
    )]
    fingerprint: Option<Vec<u8>>,
}

impl SpooledResponse {
    fn of(entry: &RememberedEntry) -> SpooledResponse {
        let (gateway, request_id, remembered) = entry;
        let Remembered {
            decision_id,
            response,
            at_ms,
            fingerprint,
        } = remembered;
        SpooledResponse {
            gateway: gateway.clone(),
            request_id: request_id.clone(),
            decision_id: decision_id.clone(),
            at_ms: *at_ms,
            response: response.clone(),
            fingerprint: fingerprint.map(|fingerprint| fingerprint.to_vec()),
        }
    }

    fn into_entry(self) -> RememberedEntry {
        let SpooledResponse {
            gateway,
            request_id,
            decision_id,
            at_ms,
            response,
            fingerprint,
        } = self;
        (
            gateway,
            request_id,
            Remembered {
                decision_id,
                response,
                at_ms,
                // One of another length is no request's.
                fingerprint: fingerprint.and_then(|fingerprint| fingerprint.as_slice().try_into().ok()),
            },
        )
    }
}

/// Bytes as lower-case hex text, for `response_hex`.
mod hex {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        use std::fmt::Write as _;
        let mut text = String::with_capacity(bytes.len() * 2);
        for byte in bytes {
            let _ = write!(text, "{byte:02x}");
        }
        serializer.serialize_str(&text)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        if text.len() % 2 != 0 {
            return Err(D::Error::custom("odd number of hex digits"));
        }
        (0..text.len())
            .step_by(2)
            .map(|at| {
                text.get(at..at + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                    .ok_or_else(|| D::Error::custom("not hex"))
            })
            .collect()
    }
}

/// [`hex`] for a field that may be absent.
mod optional_hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        bytes: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => super::hex::serialize(bytes, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        #[derive(Deserialize)]
        struct Hex(#[serde(with = "super::hex")] Vec<u8>);
        Ok(Option::<Hex>::deserialize(deserializer)?.map(|Hex(bytes)| bytes))
    }
}

#[cfg(test)]
mod tests {
    use capgate_core::access::ReasonCode;

    use super::*;
    use crate::store::{RecordCode, RecordKind, RecordOutcome};

    fn record(id: &str) -> AuditRecord {
        AuditRecord {
            decision_id: id.into(),
            at_ms: 1_795_910_400_000,
            request_id: Some("r-1".into()),
            gateway: "gw".into(),
            kind: RecordKind::Decide,
            outcome: RecordOutcome::Allow,
            code: Some(RecordCode::Reason(ReasonCode::Granted)),
            path: Some("/grants/0".into()),
            principal_id: Some("staff:ana".into()),
            issuer: Some("staff".into()),
            subject: Some("ana".into()),
            capability: Some("tickets.issue.read".into()),
            tool: None,
            account_id: Some("helpdesk-reader".into()),
            limit_calls: Some(600),
            limit_per: Some("1h".into()),
            usage_calls: Some(1),
            policy_version: Some("sha256:00".into()),
            policy_revision: Some(1),
            visible_count: None,
            visible: Vec::new(),
            door: crate::store::Door::Capgate,
            first_decision_id: None,
            arguments_digest: None,
            arguments: None,
            arguments_omitted: None,
            attributes: None,
            shadow: None,
        }
    }

    fn response() -> RememberedEntry {
        (
            "gw".to_owned(),
            "r-1".to_owned(),
            Remembered {
                decision_id: "0192".into(),
                response: vec![0, 1, 0xfe, 0xff],
                at_ms: 5,
                fingerprint: None,
            },
        )
    }

    /// The lines the hand-written JSON of earlier builds wrote for `record("0192")` and
    /// `response()`: the format, byte for byte.
    const RECORD_LINE: &str = "{\"record\":{\"decision_id\":\"0192\",\"at_ms\":1795910400000,\
        \"request_id\":\"r-1\",\"gateway\":\"gw\",\"kind\":\"decide\",\"outcome\":\"allow\",\
        \"code\":\"granted\",\"path\":\"/grants/0\",\"principal_id\":\"staff:ana\",\
        \"issuer\":\"staff\",\"subject\":\"ana\",\"capability\":\"tickets.issue.read\",\
        \"tool\":null,\"account_id\":\"helpdesk-reader\",\"limit_calls\":600,\"limit_per\":\"1h\",\
        \"usage_calls\":1,\"policy_version\":\"sha256:00\",\"policy_revision\":1}}";
    const RESPONSE_LINE: &str = "{\"remembered\":{\"gateway\":\"gw\",\"request_id\":\"r-1\",\
        \"decision_id\":\"0192\",\"at_ms\":5,\"response_hex\":\"0001feff\"}}";

    #[test]
    fn lines_are_written_as_earlier_builds_wrote_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        spool.append(&[record("0192")], &[response()], &[]).unwrap();
        let (path, _) = spool.current.as_ref().unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(text, format!("{RECORD_LINE}\n{RESPONSE_LINE}\n"));
        let (records, remembered, lost) = read_spool_file(path).unwrap();
        assert_eq!((records, remembered), (vec![record("0192")], vec![response()]));
        assert!(lost.is_empty());
    }

    #[test]
    fn a_lost_answer_travels_through_the_spool_with_the_files_last_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        let lost = LostAnswer {
            decision_id: "0192".into(),
            gateway: "gw".into(),
            at_ms: 7,
            received: Some((RecordOutcome::Deny, "usage_unknown".into())),
        };
        spool
            .append(
                &[record("0192"), record("0193")],
                &[],
                std::slice::from_ref(&lost),
            )
            .unwrap();
        let text = std::fs::read_to_string(&spool.current.as_ref().unwrap().0).unwrap();
        assert!(
            text.ends_with(
                "{\"lost_answer\":{\"decision_id\":\"0192\",\"gateway\":\"gw\",\"at_ms\":7,\
                 \"received\":[\"deny\",\"usage_unknown\"]}}\n"
            ),
            "{text}"
        );
        let first = spool.next_chunk(1).unwrap().unwrap();
        assert_eq!((first.records.len(), first.lost.len()), (1, 0));
        spool.chunk_done().unwrap();
        let last = spool.next_chunk(1).unwrap().unwrap();
        assert_eq!(last.lost, vec![lost]);
    }

    #[test]
    fn a_fingerprint_and_a_first_decision_travel_through_the_spool() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        let mut replay = record("0194");
        replay.outcome = RecordOutcome::Replayed;
        replay.first_decision_id = Some("0192".into());
        let (gateway, request_id, mut answer) = response();
        answer.fingerprint = Some([0xab; 32]);
        let entry = (gateway, request_id, answer);
        spool
            .append(&[replay.clone()], std::slice::from_ref(&entry), &[])
            .unwrap();
        let (path, _) = spool.current.as_ref().unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            text.contains(&format!("\"fingerprint_hex\":\"{}\"", "ab".repeat(32))),
            "{text}"
        );
        assert!(text.contains("\"first_decision_id\":\"0192\""), "{text}");
        let (records, remembered, _) = read_spool_file(path).unwrap();
        assert_eq!((records, remembered), (vec![replay], vec![entry]));
    }

    #[test]
    fn files_of_earlier_builds_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit-00000000000000000001-000001.jsonl");
        // A record of an unauthenticated call, its absent fields left out, as a hand-edited or
        // older file may have them.
        let bare = "{\"record\":{\"decision_id\":\"0193\",\"at_ms\":7,\"gateway\":\"gw\",\
            \"kind\":\"list\",\"outcome\":\"unauthenticated\",\"code\":\"issuer_unknown\"}}";
        std::fs::write(&path, format!("{RECORD_LINE}\n{bare}\n{RESPONSE_LINE}\n")).unwrap();
        let (records, remembered, _) = read_spool_file(&path).unwrap();
        assert_eq!(
            records,
            vec![
                record("0192"),
                AuditRecord {
                    decision_id: "0193".into(),
                    at_ms: 7,
                    gateway: "gw".into(),
                    kind: RecordKind::List,
                    outcome: RecordOutcome::Unauthenticated,
                    code: Some(RecordCode::Problem(
                        capgate_core::principals::AuthProblem::IssuerUnknown
                    )),
                    ..AuditRecord::default()
                },
            ]
        );
        assert_eq!(remembered, vec![response()]);
    }

    #[test]
    fn unreadable_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit-00000000000000000001-000001.jsonl");
        let lines = [
            // A code this build does not know, an odd response, neither kind of entry, no JSON.
            RECORD_LINE.replace("\"granted\"", "\"no_grant\""),
            RESPONSE_LINE.replace("0001feff", "0001f"),
            "{\"other\":{}}".to_owned(),
            "{\"record\": {\"decision_id\"".to_owned(),
            RECORD_LINE.to_owned(),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let (records, remembered, _) = read_spool_file(&path).unwrap();
        assert_eq!(records, vec![record("0192")]);
        assert_eq!(remembered, vec![]);
    }

    #[test]
    fn the_spool_replays_what_it_took_and_skips_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        spool.append(&[record("a"), record("b")], &[], &[]).unwrap();
        spool.append(&[record("c")], &[], &[]).unwrap();
        // A crash in the middle of an append.
        let (path, file) = spool.current.as_mut().unwrap();
        file.write_all(b"{\"record\": {\"decision_id\"").unwrap();
        let path = path.clone();

        // A new process finds the file.
        let mut reopened = Spool::open(dir.path()).unwrap();
        assert!(reopened.pending());
        let first = reopened.next_chunk(2).unwrap().unwrap();
        assert_eq!(first.records.len(), 2);
        assert!(!reopened.chunk_done().unwrap());
        let second = reopened.next_chunk(2).unwrap().unwrap();
        assert_eq!(second.records[0].decision_id, "c");
        assert!(reopened.chunk_done().unwrap());
        assert!(!path.exists());
        assert!(!reopened.pending());
    }

    #[test]
    fn refused_entries_are_set_aside_in_the_spool_format_and_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        spool
            .append(&[record("a"), record("b")], &[response()], &[])
            .unwrap();
        let (path, _) = spool.current.as_ref().unwrap();
        assert_eq!(spool.bytes, std::fs::metadata(path).unwrap().len());
        let chunk = spool.next_chunk(10).unwrap().unwrap();
        let set_aside = spool
            .quarantine(&chunk.file, &[record("b")], &[response()])
            .unwrap();
        assert_eq!(
            set_aside,
            dir.path().join("rejected").join(chunk.file.file_name().unwrap())
        );
        let (records, remembered, _) = read_spool_file(&set_aside).unwrap();
        assert_eq!((records, remembered), (vec![record("b")], vec![response()]));
        assert!(spool.chunk_done().unwrap());
        assert_eq!(spool.bytes, 0);
        // A new process finds nothing to replay: `rejected/` is not the spool.
        assert!(!Spool::open(dir.path()).unwrap().pending());
    }

    #[test]
    fn a_file_name_says_when_it_was_started() {
        let named = |name: &str| started_at(&Path::new("/spool").join(name));
        assert_eq!(
            named("audit-00000001795910400000-000003.jsonl"),
            Some(1_795_910_400_000)
        );
        assert_eq!(named("rejected.jsonl"), None);
    }

    #[test]
    fn an_unconfirmed_chunk_is_handed_out_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path()).unwrap();
        spool.append(&[record("a")], &[], &[]).unwrap();
        let once = spool.next_chunk(10).unwrap().unwrap();
        let again = spool.next_chunk(10).unwrap().unwrap();
        assert_eq!(once.records, again.records);
    }
}
