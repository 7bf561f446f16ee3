//! `capgate audit --group-by KEYS`: the matching records counted per value of some columns, by
//! the database (`GROUP BY`, `Store::audit_groups`), so a month of records is counted where it
//! lies rather than read out. The one-command answer to "who used the billing account yesterday,
//! and under which rule?" is `--account billing --since yesterday --until today --group-by
//! principal,rule`.
//!
//! Human: a table, one group per line, most records first, with the first and last instant of
//! each; `--json`: an array of objects, each key by its name (`rule` is printed as `path`, the
//! column's name), then `records`, `first_at` and `last_at`.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::clock;
use crate::store::{AuditFilter, AuditGroup, Store};

use super::super::remote::runtime;
use super::super::{Exit, Failure, Outcome};
use super::Query;

pub(super) fn run(args: &Query, filter: &AuditFilter) -> Result<Outcome, Failure> {
    let keys = &args.group_by;
    if let Some(twice) = keys
        .iter()
        .enumerate()
        .find_map(|(at, key)| keys[..at].contains(key).then_some(key))
    {
        return Err(Failure::Usage(format!(
            "`--group-by` names `{}` twice",
            twice.as_str()
        )));
    }
    let groups = runtime()?.block_on(async {
        let store = args.database.open_existing().await?;
        store
            .audit_groups(filter, keys)
            .await
            .map_err(|error| args.database.explain(error))
    })?;
    let names: Vec<&str> = keys.iter().map(|key| key.as_str()).collect();
    let stdout = if args.json {
        super::super::to_json(&Value::Array(
            groups.iter().map(|group| json(&names, group)).collect(),
        ))
    } else {
        human(&names, &groups, filter.limit)
    };
    Ok(Outcome::stdout(stdout, Exit::Done))
}

fn json(names: &[&str], group: &AuditGroup) -> Value {
    let AuditGroup {
        values,
        records,
        first_at_ms,
        last_at_ms,
    } = group;
    let mut object = Map::new();
    for (name, value) in names.iter().zip(values) {
        object.insert(
            (*name).to_owned(),
            value.clone().map_or(Value::Null, Value::String),
        );
    }
    object.insert("records".to_owned(), Value::from(*records));
    object.insert("first_at".to_owned(), Value::from(clock::format(*first_at_ms)));
    object.insert("last_at".to_owned(), Value::from(clock::format(*last_at_ms)));
    Value::Object(object)
}

/// A table with a header; an empty value shows as `-`. The columns are as wide as their widest
/// cell, so the table reads the same whatever it holds.
fn human(names: &[&str], groups: &[AuditGroup], limit: u32) -> String {
    let mut out = String::new();
    if groups.is_empty() {
        let _ = writeln!(out, "no audit record matches");
        return out;
    }
    let mut rows: Vec<Vec<String>> = vec![names
        .iter()
        .map(|name| (*name).to_owned())
        .chain(["records", "first", "last"].map(str::to_owned))
        .collect()];
    for group in groups {
        rows.push(
            group
                .values
                .iter()
                .map(|value| value.clone().unwrap_or_else(|| "-".to_owned()))
                .chain([
                    group.records.to_string(),
                    clock::format(group.first_at_ms),
                    clock::format(group.last_at_ms),
                ])
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in &rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:width$}  ");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let records: u64 = groups.iter().map(|group| group.records).sum();
    let _ = writeln!(
        out,
        "{} group{}, {records} record{}",
        groups.len(),
        if groups.len() == 1 { "" } else { "s" },
        if records == 1 { "" } else { "s" }
    );
    if u32::try_from(groups.len()).is_ok_and(|shown| shown == limit) {
        let _ = writeln!(out, "(the first {limit} groups: raise --limit for more)");
    }
    out
}
