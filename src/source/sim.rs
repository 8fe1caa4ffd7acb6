/*!
The `sim` source: a simulated fleet of tapes, for the demo, benchmarks and tests.
It touches the tape's packet layout, the records and the clock.

The fleet is a pure function of the seed: the same settings give the same MACs, the same
schedule and the same packets, so a non-real-time run is a deterministic input for the
whole pipeline. Each tape adverts every `interval_ms` at its own phase, under company
0x0EF7 with the payload of [`tape`], which the mock service decodes.

A tape's payload changes every `change_every` adverts: the counter goes up by one, the
temperature takes a step of a slow random walk around the tape's own level (4–25 °C),
the battery now and then loses a percent, and a shock is now and then counted. The
first `unregistered` tapes have MACs starting `C0:DE:AD` ([`UNREGISTERED_PREFIX`]),
which the mock service does not know. Adverts of other devices (Apple, Microsoft, Samsung, Google company ids, and
Eddystone service data) come in between, `others_ratio` of them per tape advert, so that
product filtering has something to drop.

With `realtime` the source sleeps to advert at the real rate and stamps adverts with the
wall clock; without it, it sends as fast as the channel takes them with synthetic
capture times from `start_ms`.
*/

use crate::clock::SharedClock;
use std::collections::HashSet;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::config::SimSettings;
use crate::record::{Advertisement, EpochMillis, Mac};
use tape::{TapeReading, TAPE_COMPANY_ID, UNREGISTERED_PREFIX};

use super::{Heard, Source, SourceError, SourceReport};

/// Company identifiers of the other devices: Apple, Microsoft, Samsung, Google.
const OTHER_COMPANIES: [u16; 4] = [0x004C, 0x0006, 0x0075, 0x00E0];
const EDDYSTONE_UUID: &str = "0000feaa-0000-1000-8000-00805f9b34fb";
/// How many other devices are around.
const OTHER_DEVICES: usize = 16;

/// The simulated fleet as a [`Source`].
#[derive(Debug, Clone)]
pub struct Sim {
    pub settings: SimSettings,
    /// Stamps a real-time simulation's adverts.
    clock: SharedClock,
}

impl Sim {
    pub fn new(settings: SimSettings, clock: SharedClock) -> Self {
        Sim { settings, clock }
    }

    /// The MACs of the tapes, `TT-0001` first; the first `unregistered` start `C0:DE:AD`.
    pub fn fleet(settings: &SimSettings) -> Vec<Mac> {
        Fleet::new(settings).tapes.iter().map(|t| t.mac).collect()
    }
}

impl Source for Sim {
    async fn run(
        self,
        out: mpsc::Sender<Heard>,
        stop: CancellationToken,
    ) -> Result<SourceReport, SourceError> {
        let s = &self.settings;
        let mut fleet = Fleet::new(s);
        let mut report = SourceReport::default();
        let started = Instant::now();
        tracing::info!(
            tapes = s.tapes,
            unregistered = s.unregistered.min(s.tapes),
            interval_ms = s.interval_ms,
            realtime = s.realtime,
            "simulated fleet started"
        );
        while !stop.is_cancelled() {
            let Some((offset_ms, mut adv)) = fleet.next_advert() else {
                break;
            };
            if s.duration_ms.is_some_and(|d| offset_ms >= d) {
                break;
            }
            if s.realtime {
                let deadline = started + std::time::Duration::from_millis(offset_ms);
                if deadline > Instant::now() {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        () = stop.cancelled() => break,
                    }
                }
                adv.ts_ms = self.clock.wall_ms();
            } else {
                adv.ts_ms = s.start_ms.saturating_add(offset_ms as EpochMillis);
            }
            tokio::select! {
                biased;
                sent = out.send(Heard::from(adv)) => if sent.is_err() { break },
                () = stop.cancelled() => break,
            }
            report.adverts += 1;
        }
        tracing::info!(adverts = report.adverts, "simulated fleet ended");
        Ok(report)
    }
}

/// One simulated tape.
#[derive(Debug)]
struct Tape {
    mac: Mac,
    name: String,
    /// When in each interval it adverts.
    phase_ms: u64,
    reading: TapeReading,
    /// The level its temperature wanders around.
    home_temp_centi: i16,
    rssi_level: i16,
    adverts: u64,
}

/// The fleet and its schedule: a pure, deterministic generator of adverts.
#[derive(Debug)]
struct Fleet {
    rng: fastrand::Rng,
    /// In `TT-0001` order.
    tapes: Vec<Tape>,
    /// Indexes of `tapes` by phase: with one interval for all, every round of adverts
    /// goes in this order.
    order: Vec<usize>,
    others: Vec<Mac>,
    interval_ms: u64,
    change_every: u64,
    others_ratio: f64,
    round: u64,
    next_in_round: usize,
    /// Other adverts still to come in the current slot, and its offset.
    pending_others: u32,
    slot_ms: u64,
}

impl Fleet {
    fn new(s: &SimSettings) -> Fleet {
        let mut rng = fastrand::Rng::with_seed(s.seed);
        let interval_ms = s.interval_ms.max(1);
        let mut used = HashSet::new();
        let mut tapes = Vec::with_capacity(s.tapes);
        for i in 0..s.tapes {
            let mac = loop {
                let mut o = [0u8; 6];
                rng.fill(&mut o);
                if i < s.unregistered {
                    o[..3].copy_from_slice(&UNREGISTERED_PREFIX);
                } else {
                    o[0] |= 0xC0; // a random static address
                }
                let registered_lookalike = i >= s.unregistered && o[..3] == UNREGISTERED_PREFIX;
                if !registered_lookalike && used.insert(o) {
                    break Mac::new(o);
                }
            };
            let home_temp_centi = rng.i16(400..=2500);
            tapes.push(Tape {
                mac,
                name: format!("TT-{:04}", i + 1),
                phase_ms: rng.u64(0..interval_ms),
                reading: TapeReading {
                    counter: rng.u16(..),
                    temp_centi: home_temp_centi,
                    battery: rng.u8(60..=100),
                    shock_count: 0,
                    serial: rng.u32(..) & 0x00FF_FFFF,
                },
                home_temp_centi,
                rssi_level: rng.i16(-85..=-55),
                adverts: 0,
            });
        }
        let others = (0..OTHER_DEVICES)
            .map(|_| loop {
                let mut o = [0u8; 6];
                rng.fill(&mut o);
                if o[..3] != UNREGISTERED_PREFIX && used.insert(o) {
                    break Mac::new(o);
                }
            })
            .collect();
        let mut order: Vec<usize> = (0..tapes.len()).collect();
        order.sort_by_key(|&i| (tapes[i].phase_ms, i));
        Fleet {
            rng,
            tapes,
            order,
            others,
            interval_ms,
            change_every: u64::from(s.change_every.max(1)),
            others_ratio: if s.others_ratio.is_finite() {
                s.others_ratio.max(0.0)
            } else {
                0.0
            },
            round: 0,
            next_in_round: 0,
            pending_others: 0,
            slot_ms: 0,
        }
    }

    /// The next advert and its offset from the start; `None` without tapes. The
    /// advert's `ts_ms` is the offset; the caller stamps the capture time.
    fn next_advert(&mut self) -> Option<(u64, Advertisement)> {
        if self.pending_others > 0 {
            self.pending_others -= 1;
            return Some((self.slot_ms, self.other_advert()));
        }
        let &i = self.order.get(self.next_in_round)?;
        let offset = self
            .round
            .saturating_mul(self.interval_ms)
            .saturating_add(self.tapes[i].phase_ms);
        self.next_in_round += 1;
        if self.next_in_round == self.order.len() {
            self.next_in_round = 0;
            self.round += 1;
        }
        let adv = self.tape_advert(i);
        self.slot_ms = offset;
        let whole = self.others_ratio.trunc();
        let extra = self.rng.f64() < self.others_ratio - whole;
        self.pending_others = (whole as u32).saturating_add(u32::from(extra));
        Some((offset, adv))
    }

    fn tape_advert(&mut self, i: usize) -> Advertisement {
        let rng = &mut self.rng;
        let tape = &mut self.tapes[i];
        if tape.adverts > 0 && tape.adverts % self.change_every == 0 {
            let r = &mut tape.reading;
            r.counter = r.counter.wrapping_add(1);
            let pull = (tape.home_temp_centi - r.temp_centi) / 16;
            r.temp_centi = r
                .temp_centi
                .saturating_add(rng.i16(-15..=15) + pull)
                .clamp(-4000, 8500);
            if rng.u8(..40) == 0 {
                r.battery = r.battery.saturating_sub(1);
            }
            if rng.u8(..50) == 0 {
                r.shock_count = r.shock_count.wrapping_add(1);
            }
        }
        tape.adverts += 1;
        Advertisement {
            ts_ms: 0,
            mac: tape.mac,
            rssi: Some((tape.rssi_level + rng.i16(-5..=5)).clamp(-90, -50)),
            name: Some(tape.name.clone()),
            manufacturer_data: vec![(TAPE_COMPANY_ID, tape.reading.payload().to_vec())],
            service_data: Vec::new(),
        }
    }

    fn other_advert(&mut self) -> Advertisement {
        let rng = &mut self.rng;
        let device = rng.usize(..self.others.len());
        let mut data = vec![0u8; rng.usize(2..=24)];
        rng.fill(&mut data);
        // A quarter of the other devices are Eddystone beacons (service data only).
        let (manufacturer_data, service_data) = if device % 4 == 3 {
            (Vec::new(), vec![(EDDYSTONE_UUID.to_string(), data)])
        } else {
            let company = OTHER_COMPANIES[device % OTHER_COMPANIES.len()];
            (vec![(company, data)], Vec::new())
        };
        Advertisement {
            ts_ms: 0,
            mac: self.others[device],
            rssi: Some(rng.i16(-95..=-40)),
            name: None,
            manufacturer_data,
            service_data,
        }
    }
}

#[cfg(test)]
mod tests;

pub mod tape;
