//! Settling what the service answered: in one transaction a row leaves `pending` with
//! its count (delivered) or its dead letter, beside the notes the answer carries (the
//! flusher's state, the tapes heard refused as unknown) and, when due, the tapes'
//! latest readings. It touches `db`, the side tables' `heard`, `latest.rs`, the outbox's
//! words and the [`Store`] it writes.

use rusqlite::{params, Transaction};

use super::status::FlusherState;
use super::store::Store;
use super::words::{Outcome, PendingCapture, TapeRow};
use crate::db::{
    mac_to_int, packet_value, read_counters, write_counters, write_tx, Counters, OutboxError,
};
use crate::record::EpochMillis;
use crate::side_tables::{self, HeardChanges};

/// Stored dead letters at most; past it the oldest are dropped (and counted).
pub const MAX_DEAD_LETTERS: u64 = 100_000;

/// What is recorded in the transaction that records the answers, beside them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnswerNotes {
    /// The flusher's state, for `status`.
    pub flusher: Option<FlusherState>,
    /// Tapes refused as unknown, and known again (`device add --nearest`).
    pub heard: HeardChanges,
}

impl Store {
    /// Records what became of pending captures, in one transaction: a row leaves
    /// `pending` only here, together with its count (delivered) or its dead letter, and
    /// its claim is let go. A row already gone (its database replaced, say: a claimed
    /// row is never evicted) changes no counter. A delivered capture's reading becomes
    /// its tape's latest, kept in memory and written behind (`latest.rs`).
    /// Returns how many rows left.
    pub(super) fn settle(
        &mut self,
        outcomes: &[(PendingCapture, Outcome)],
        now: EpochMillis,
    ) -> Result<u64, OutboxError> {
        self.settle_noting(outcomes, now, &AnswerNotes::default())
    }

    /// [`Store::settle`], recording in the same transaction (one commit, one sync) the
    /// flusher's state for `status` and the tapes heard that `--nearest` needs.
    pub(super) fn settle_noting(
        &mut self,
        outcomes: &[(PendingCapture, Outcome)],
        now: EpochMillis,
        notes: &AnswerNotes,
    ) -> Result<u64, OutboxError> {
        for (p, outcome) in outcomes {
            if let Outcome::Delivered(r) = outcome {
                // A reading the service decoded is kept even if its row was evicted
                // meanwhile; only the counter follows the row.
                let c = &p.capture;
                self.latest.note(TapeRow {
                    mac: c.mac,
                    qr_code: r.qr_code.clone(),
                    captured_at: c.ts_ms,
                    decoded_at: now,
                    rssi: c.rssi,
                    temp: r.temp,
                    bat: r.bat,
                });
            }
        }
        let write_latest = self.latest.due();
        let tx = write_tx(&mut self.conn).map_err(OutboxError::WriteFailed)?;
        let latest = &self.latest;
        let (removed, next) = (|| -> rusqlite::Result<(u64, Counters)> {
            let current = read_counters(&tx)?;
            let mut next = current;
            let mut removed = 0;
            let mut delete = tx.prepare_cached("DELETE FROM pending WHERE id = ?1")?;
            let mut dead = tx.prepare_cached(
                "INSERT INTO dead_letters(mac, captured_at, product_id, packet, rssi, error, dead_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for (p, outcome) in outcomes {
                let gone = delete.execute([p.id])? == 1;
                removed += u64::from(gone);
                let c = &p.capture;
                match outcome {
                    Outcome::Delivered(_) => next.delivered += u64::from(gone),
                    Outcome::DeadLetter(error) if gone => {
                        // The service's reason, bounded as every text from elsewhere.
                        let error = crate::util::text::bounded(error, crate::util::text::SHOWN_MAX_CHARS);
                        dead.execute(params![mac_to_int(c.mac), c.ts_ms, c.product_id, packet_value(&c.packet), c.rssi, error, now])?;
                        next.dead_lettered += 1;
                    }
                    Outcome::DeadLetter(_) => {}
                }
            }
            if next.dead_lettered > current.dead_lettered {
                next.dead_letters_dropped += cap_dead_letters(&tx, MAX_DEAD_LETTERS)?;
            }
            write_counters(&tx, &current, &next)?;
            if let Some(f) = &notes.flusher {
                f.write(&tx)?;
            }
            side_tables::heard::record(&tx, &notes.heard, now)?;
            if write_latest {
                latest.write(&tx)?;
            } else {
                latest.write_firsts(&tx)?;
            }
            Ok((removed, next))
        })()
        .map_err(OutboxError::WriteFailed)?;
        tx.commit().map_err(OutboxError::WriteFailed)?;
        self.counters = next;
        if write_latest {
            self.latest.written();
        } else {
            self.latest.firsts_written();
        }
        for (p, _) in outcomes {
            self.claimed.remove(&p.id);
        }
        if !self.cursor.is_empty() {
            let ids: Vec<i64> = outcomes.iter().map(|(p, _)| p.id).collect();
            self.cursor.claimed(&ids);
        }
        Ok(removed)
    }
}

fn cap_dead_letters(tx: &Transaction<'_>, max: u64) -> rusqlite::Result<u64> {
    let stored: i64 = tx.query_row("SELECT COUNT(*) FROM dead_letters", [], |r| r.get(0))?;
    let excess = (stored as u64).saturating_sub(max);
    if excess == 0 {
        return Ok(0);
    }
    Ok(tx.execute(
        "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters ORDER BY id LIMIT ?1)",
        [excess as i64],
    )? as u64)
}

#[cfg(test)]
mod tests {
    use crate::outbox::tests as fixture;
    use std::collections::HashSet;

    use super::*;
    use crate::outbox::{Reading, StoreOptions};
    use crate::record::Capture;

    fn capture(i: u8) -> Capture {
        Capture {
            rssi: None,
            ..fixture::capture(
                fixture::mac(i),
                1_763_719_200_000 + i64::from(i),
                format!("{i:02X}"),
            )
        }
    }

    fn open(dir: &tempfile::TempDir, max_pending: u64) -> Store {
        let options = StoreOptions {
            max_pending,
            ..StoreOptions::default()
        };
        Store::open(dir.path(), options).unwrap().0
    }

    #[test]
    fn an_answer_for_rows_already_gone_changes_no_count_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(&dir, 10);
        s.enqueue(&[capture(1), capture(2)]).unwrap();
        let rows = s
            .fetch_next_batch(2, 100, &HashSet::new(), &[])
            .unwrap()
            .rows;
        let delivered = Outcome::Delivered(Reading {
            qr_code: Some("TT".into()),
            temp: None,
            bat: None,
        });
        let settle = vec![
            (rows[0].clone(), delivered),
            (rows[1].clone(), Outcome::DeadLetter("refused".into())),
        ];
        assert_eq!(s.settle(&settle, 0).unwrap(), 2);
        // The same answer recorded again (or an answer for rows a replaced database no
        // longer holds): nothing left, nothing counted.
        assert_eq!(s.settle(&settle, 0).unwrap(), 0);
        let stats = s.stats().unwrap();
        assert_eq!(
            (
                stats.admitted,
                stats.delivered,
                stats.dead_letters,
                stats.evicted,
                stats.pending
            ),
            (2, 1, 1, 0, 0)
        );
        assert_eq!(stats.dead_letters_stored, 1);
    }
}
