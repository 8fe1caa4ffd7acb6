/*!
The mock's wall clock: the machine's, or the machine's moved by a fixed offset, so that
a test of what depends on the day (history's year and months, the seeded events, when a
request was received) runs on the day it names rather than on the day it happens to
run. The offset is the one tapegate's test clock file takes (`wall_offset_ms`), so a
test moves the gateway and the service alike.
*/

use std::time::{Duration, SystemTime};

/// The mock's wall clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockClock {
    offset_ms: i64,
}

impl MockClock {
    /// The machine's clock.
    pub fn machine() -> Self {
        MockClock::default()
    }

    /// The machine's clock moved by `offset_ms` (negative: behind it).
    pub fn offset_ms(offset_ms: i64) -> Self {
        MockClock { offset_ms }
    }

    /// The time now by this clock.
    pub fn now(&self) -> SystemTime {
        let shift = Duration::from_millis(self.offset_ms.unsigned_abs());
        let machine = SystemTime::now();
        let moved = if self.offset_ms >= 0 {
            machine.checked_add(shift)
        } else {
            machine.checked_sub(shift)
        };
        moved.unwrap_or(machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_clock_reads_the_machines_plus_its_offset() {
        let day = Duration::from_secs(86_400);
        let machine = SystemTime::now();
        let back = MockClock::offset_ms(-86_400_000).now();
        let ahead = MockClock::offset_ms(86_400_000).now();
        let after = SystemTime::now();
        assert!(back >= machine - day && back <= after - day);
        assert!(ahead >= machine + day && ahead <= after + day);
        assert!(MockClock::machine().now() >= after);
    }
}
