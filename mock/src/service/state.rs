/*!
The state every part of the mock shares, in one place: the configuration in force, the
tokens granted, the faults queued and standing, the account (devices, locations,
history, rate windows) and the record of what was received. It sits behind one std
mutex ([`Shared`]) that is never held across an await: the router takes out what a
request needs, hands each part of the spec its own piece, and puts the results back.
*/

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::clock::MockClock;
use crate::config::{MockConfig, MockEnvironment, Registry, WireRules, DEFAULT_RECORD_LIMIT};
use crate::devices::Devices;
use crate::fault::{Fault, Rolling, Standing};
use crate::history::HistorySeed;
use crate::locations::LocationSeed;
use crate::rate::RateWindow;
use crate::readings::Readings;
use crate::record::{Endpoint, MockStats, OperatorReceived, Received};
use crate::seed::Seed;
use crate::token::Tokens;

/// Operator requests kept in the record.
const RECORD_LIMIT: usize = 10_000;

/// Everything the endpoints share: configuration, granted tokens, faults, the record.
pub(crate) struct State {
    pub envs: Vec<MockEnvironment>,
    pub registry: Registry,
    pub max_items: usize,
    pub wire: WireRules,
    /// The API identity lacks the decode permission: 401 with any token.
    pub permission_denied: bool,
    /// Item errors quote the request's bearer token (a careless server).
    pub echo_token_in_errors: bool,
    pub tokens: Tokens,
    pub faults: VecDeque<Fault>,
    pub storm: Option<Rolling>,
    /// Plain form of the poison MAC.
    pub poison: Option<String>,
    pub standing: Standing,
    pub received: VecDeque<Received>,
    pub recording: bool,
    pub record_limit: usize,
    pub stats: MockStats,
    /// The operator endpoints' state: devices, seeds, rate windows, their record.
    pub ops: OpsState,
}

impl State {
    pub(crate) fn new(config: MockConfig) -> Self {
        State {
            ops: OpsState::new(&config),
            envs: config.environments,
            registry: config.registry,
            max_items: config.max_items,
            wire: config.wire,
            permission_denied: false,
            echo_token_in_errors: false,
            tokens: Tokens::default(),
            faults: VecDeque::new(),
            storm: None,
            poison: None,
            standing: Standing::default(),
            received: VecDeque::new(),
            recording: true,
            record_limit: DEFAULT_RECORD_LIMIT,
            stats: MockStats::default(),
        }
    }

    pub fn trim_records(&mut self) {
        while self.received.len() > self.record_limit {
            self.received.pop_front();
            self.stats.dropped_records += 1;
        }
    }

    pub(crate) fn record(&mut self, r: Received) {
        if r.status == Some(200) {
            self.stats.decoded_items += r.decoded as u64;
        }
        if r.fault.is_some() {
            self.stats.faults_applied += 1;
        }
        if self.recording {
            self.received.push_back(r);
            self.trim_records();
        }
    }
}

/// The operator side of the mock's state.
#[derive(Debug)]
pub(crate) struct OpsState {
    pub devices: Devices,
    pub locations: LocationSeed,
    pub history: HistorySeed,
    pub windows: HashMap<String, RateWindow>,
    pub rate_limit: u32,
    pub rate_window: Duration,
    /// The reading played on each point the spec leaves open.
    pub readings: Readings,
    pub faults: HashMap<Endpoint, VecDeque<Fault>>,
    /// Faults for the n-th request (from 1) to an endpoint.
    pub scheduled: HashMap<(Endpoint, u64), Fault>,
    /// Requests that arrived at each endpoint (counted on arrival).
    pub arrivals: HashMap<Endpoint, u64>,
    /// One-shot faults of the token endpoint.
    pub token_faults: VecDeque<Fault>,
    /// Endpoints the API identity has no permission for.
    pub denied: HashSet<Endpoint>,
    pub received: VecDeque<OperatorReceived>,
    pub counts: HashMap<Endpoint, u64>,
}

impl OpsState {
    /// The seeded account, anchored at the current wall time.
    fn new(config: &MockConfig) -> Self {
        let seeded = Seed::new(config.clock.now(), &config.demo_fleet);
        let mut devices = Devices::default();
        for d in seeded.devices {
            devices.insert(d);
        }
        OpsState {
            devices,
            locations: seeded.locations,
            history: seeded.history,
            windows: HashMap::new(),
            rate_limit: config.rate_limit,
            rate_window: config.rate_window,
            readings: config.readings,
            faults: HashMap::new(),
            scheduled: HashMap::new(),
            arrivals: HashMap::new(),
            token_faults: VecDeque::new(),
            denied: HashSet::new(),
            received: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// Counts a request of environment `env` in its rate window; whether it is within
    /// the limit.
    pub fn admit(&mut self, env: &str) -> bool {
        let (limit, length, reading) = (self.rate_limit, self.rate_window, self.readings.rate);
        self.windows
            .entry(env.to_string())
            .or_insert_with(RateWindow::new)
            .admit(Instant::now(), limit, length, reading)
    }

    pub fn record(&mut self, r: OperatorReceived) {
        *self.counts.entry(r.endpoint).or_default() += 1;
        self.received.push_back(r);
        while self.received.len() > RECORD_LIMIT {
            self.received.pop_front();
        }
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    clock: MockClock,
}

impl Shared {
    pub fn new(config: MockConfig) -> Self {
        Shared {
            clock: config.clock,
            state: Mutex::new(State::new(config)),
        }
    }

    /// The time now by the mock's clock.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Runs `f` on the state. Never held across an await, so a poisoned lock still
    /// guards consistent data.
    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    pub fn environment(&self, name: &str) -> Option<MockEnvironment> {
        self.with(|s| s.envs.iter().find(|e| e.name == name).cloned())
    }

    pub fn environment_names(&self) -> Vec<String> {
        self.with(|s| s.envs.iter().map(|e| e.name.clone()).collect())
    }
}

/// Keeps a decode request's MACs "in progress" until dropped: when the answer is on its
/// way, or when the client gave up and the connection (with the handler) was dropped.
pub(crate) struct InProgress<'a> {
    shared: &'a Shared,
    macs: Vec<String>,
}

impl<'a> InProgress<'a> {
    /// Notes a request holding `macs` (plain form) as in progress, and applies the
    /// standing faults (see [`Standing::enter`]).
    pub fn enter(
        shared: &'a Shared,
        macs: Vec<String>,
        queued: Option<Fault>,
    ) -> (Option<Fault>, crate::fault::Shaping, InProgress<'a>) {
        let (fault, shaping) = shared.with(|s| s.standing.enter(&macs, queued));
        (fault, shaping, InProgress { shared, macs })
    }
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.shared.with(|s| s.standing.leave(&self.macs));
    }
}
