//! What a `queue-workload` child reported, and the check of a queue against it: every record
//! reported durable is still there with its content, or was acknowledged, or is counted as lost;
//! no sequence number was given to two events.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;

use edgewatch_queue::{Queue, TIERS};

use super::{name_of, read_everything};

#[derive(Default)]
pub struct Ledger {
    /// `(epoch, tier index, seq)` → event name.
    pub durable: BTreeMap<(u64, usize, u64), String>,
    /// `(epoch, tier index, first, last)`.
    pub acked: Vec<(u64, usize, u64, u64)>,
    pub epochs: Vec<u64>,
    pub lines: usize,
}

/// Totals from one check.
#[derive(Debug, Default, Clone, Copy)]
pub struct Checked {
    pub present: u64,
    pub acked: u64,
    pub counted_lost: u64,
    /// The key-value area named a record, and it was checked.
    pub kv_checked: bool,
}

impl Ledger {
    /// Takes the complete lines of a child's stdout (a line cut by the kill is ignored).
    pub fn ingest(&mut self, output: &str) -> Result<(), String> {
        let complete = match output.rfind('\n') {
            Some(end) => &output[..=end],
            None => "",
        };
        for line in complete.lines() {
            self.lines += 1;
            let words: Vec<&str> = line.split(' ').collect();
            let epoch = self.epochs.last().copied().unwrap_or(0);
            let num = |i: usize| -> Result<u64, String> {
                words
                    .get(i)
                    .and_then(|w| w.parse().ok())
                    .ok_or_else(|| format!("bad line {line:?}"))
            };
            match words[0] {
                "E" => {
                    let epoch = u64::from_str_radix(words[1], 16).map_err(|e| e.to_string())?;
                    if self.epochs.last() != Some(&epoch) {
                        self.epochs.push(epoch);
                    }
                }
                "D" => {
                    let key = (epoch, num(1)? as usize - 1, num(2)?);
                    let name = words[3].to_owned();
                    if let Some(previous) = self.durable.insert(key, name.clone())
                        && previous != name
                    {
                        return Err(format!(
                            "sequence number {key:?} reported durable for {previous} and {name}"
                        ));
                    }
                }
                "A" => self
                    .acked
                    .push((epoch, num(1)? as usize - 1, num(2)?, num(3)?)),
                "R" => {}
                other => return Err(format!("unknown line kind {other:?}")),
            }
        }
        Ok(())
    }

    /// Checks the queue against everything reported for its epoch.
    pub fn check(&self, queue: &mut Queue, now: std::time::SystemTime) -> Result<Checked, String> {
        let epoch = queue.epoch();
        let all = read_everything(queue);
        let status = queue.status(now);
        let mut checked = Checked::default();
        let mut names = BTreeMap::new();
        for ((tier, seq), event) in &all {
            if let Some(name) = name_of(event)
                && let Some(other) = names.insert(name.to_owned(), (*tier, *seq))
            {
                return Err(format!(
                    "{name} stored twice: {other:?} and {:?}",
                    (tier, seq)
                ));
            }
        }
        // The key-value area names the workload's last append committed with it: never a
        // record that is not durable, and the stored record under that number is that one.
        if let Some(last) = queue.kv("workload/last") {
            let last = String::from_utf8_lossy(last).into_owned();
            let mut parts = last.split(' ');
            let (Some(Ok(tier)), Some(Ok(seq)), Some(name)) = (
                parts.next().map(str::parse::<usize>),
                parts.next().map(str::parse::<u64>),
                parts.next(),
            ) else {
                return Err(format!("key-value entry {last:?} is not `tier seq name`"));
            };
            let tier = TIERS[tier - 1];
            if seq > queue.durable_seq(tier) {
                return Err(format!(
                    "the key-value area names {last:?}, beyond the durable {} of {tier:?}",
                    queue.durable_seq(tier)
                ));
            }
            if let Some(event) = all.get(&(tier, seq))
                && name_of(event) != Some(name)
            {
                return Err(format!(
                    "the key-value area names {last:?}, stored there is {:?}",
                    name_of(event)
                ));
            }
            checked.kv_checked = true;
        }
        let mut missing = [0u64; 3];
        for ((e, tier, seq), name) in &self.durable {
            if *e != epoch {
                continue;
            }
            match all.get(&(TIERS[*tier], *seq)) {
                Some(event) => {
                    if name_of(event) != Some(name.as_str()) {
                        return Err(format!(
                            "tier {tier} seq {seq} reported durable as {name}, stored as {:?}",
                            name_of(event)
                        ));
                    }
                    checked.present += 1;
                }
                None if self
                    .acked
                    .iter()
                    .any(|&(ae, at, f, l)| ae == epoch && at == *tier && (f..=l).contains(seq)) =>
                {
                    checked.acked += 1;
                }
                None => missing[*tier] += 1,
            }
        }
        for (ix, tier) in TIERS.iter().enumerate() {
            let t = status.tiers.get(*tier).unwrap();
            let counted = t.evicted + t.expired + t.corrupt;
            if missing[ix] > counted {
                return Err(format!(
                    "{tier:?}: {} durable records missing, only {counted} counted as lost",
                    missing[ix]
                ));
            }
            checked.counted_lost += missing[ix];
        }
        Ok(checked)
    }
}
