/*!
Where the spec is silent, a real service may have chosen either way; the mock plays each
reading, chosen per test ([`Readings`], [`MockConfig::readings`](crate::MockConfig),
[`MockHandle::set_readings`](crate::MockHandle::set_readings)), so that a client built on one reading fails a test under
the other. The operator tests run against [`Readings::variants`], which between them
play every reading of every point. Plain data: a leaf.

| open point (spec) | readings |
|---|---|
| which 1,000 events a full history answer holds (4.2) | the oldest or the newest of the range |
| the order of a history answer (4.2, 2.2) | ascending or descending time |
| how long "one month" of history is (4.2, 8) | 31 or 30 days |
| where the label lookup puts a label (4.7, 2.4) | nested under `label`, or its fields flat on the entry |
| where the shared rate window starts (8: "fixed 60-second window") | at the first request after the last window ended, or on a fixed grid (clock minutes) |
| which QR code a per-device result names (2.5) | the one sent, or the service's normalised form (trimmed, upper case, matched without regard to case) |
*/

/// Which 1,000 events a history range holding more answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryKeeps {
    Oldest,
    /// The likelier reading: with no time frame "the latest event is returned".
    Newest,
}

/// The order of the events in a history answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryOrder {
    Ascending,
    Descending,
}

/// How the label lookup reports a device's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupShape {
    /// `{"qrcode", "status", ..., "label": {"asset_barcode", "application_id",
    /// "shipment"} | null}`.
    Nested,
    /// `{"qrcode", "status", "asset_barcode", "application_id", "shipment", ...}`: the
    /// fields of spec 2.4's label record on the entry itself (null when unlabelled).
    Flat,
}

/// Where the shared rate window of spec 8 starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateWindows {
    /// A window starts with the first request after the previous one ended.
    FromFirstRequest,
    /// Windows follow each other on a fixed grid of the window's length, as clock
    /// minutes do, whether requests come or not. The grid's phase is where the first
    /// request fell (a real service's phase against a client's first request is
    /// arbitrary; fixing it here makes a test repeatable).
    Grid,
}

/// Which QR code a per-device result (`errors[].qrcode`, the lookup's `qrcode`) names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QrEcho {
    /// The QR code exactly as sent; devices are matched exactly.
    AsSent,
    /// The service's own form: trimmed and upper case. Devices are matched without
    /// regard to case.
    Normalised,
}

/// The mock's choice on every open point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readings {
    pub history_keeps: HistoryKeeps,
    pub history_order: HistoryOrder,
    /// The longest history time frame one request may ask, in days.
    pub month_days: i64,
    pub lookup: LookupShape,
    pub rate: RateWindows,
    pub qr_echo: QrEcho,
}

impl Default for Readings {
    /// The mock's first choices (before issue 21): oldest 1,000 in ascending order, 31
    /// days, nested label, window from the first request, QR codes as sent.
    fn default() -> Self {
        Readings {
            history_keeps: HistoryKeeps::Oldest,
            history_order: HistoryOrder::Ascending,
            month_days: 31,
            lookup: LookupShape::Nested,
            rate: RateWindows::FromFirstRequest,
            qr_echo: QrEcho::AsSent,
        }
    }
}

impl Readings {
    /// Four services that between them play every reading of every point (and both
    /// orders with both ends of history).
    pub fn variants() -> [Readings; 4] {
        let a = Readings::default();
        let b = Readings {
            history_keeps: HistoryKeeps::Newest,
            history_order: HistoryOrder::Descending,
            month_days: 30,
            lookup: LookupShape::Flat,
            rate: RateWindows::Grid,
            qr_echo: QrEcho::Normalised,
        };
        let c = Readings {
            history_keeps: HistoryKeeps::Newest,
            history_order: HistoryOrder::Ascending,
            lookup: LookupShape::Flat,
            ..a
        };
        let d = Readings {
            history_keeps: HistoryKeeps::Oldest,
            history_order: HistoryOrder::Descending,
            month_days: 30,
            rate: RateWindows::Grid,
            qr_echo: QrEcho::Normalised,
            ..a
        };
        [a, b, c, d]
    }

    /// The QR code as this service keys and echoes it.
    pub fn qr_key(&self, qr: &str) -> String {
        match self.qr_echo {
            QrEcho::AsSent => qr.to_string(),
            QrEcho::Normalised => qr.trim().to_uppercase(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variants_play_every_reading_of_every_point() {
        let v = Readings::variants();
        let has = |f: &dyn Fn(&Readings) -> bool| v.iter().any(f);
        assert!(has(&|r| r.history_keeps == HistoryKeeps::Oldest));
        assert!(has(&|r| r.history_keeps == HistoryKeeps::Newest));
        for keeps in [HistoryKeeps::Oldest, HistoryKeeps::Newest] {
            for order in [HistoryOrder::Ascending, HistoryOrder::Descending] {
                assert!(has(
                    &|r| r.history_keeps == keeps && r.history_order == order
                ));
            }
        }
        assert!(has(&|r| r.month_days == 30) && has(&|r| r.month_days == 31));
        assert!(has(&|r| r.lookup == LookupShape::Nested));
        assert!(has(&|r| r.lookup == LookupShape::Flat));
        assert!(has(&|r| r.rate == RateWindows::FromFirstRequest));
        assert!(has(&|r| r.rate == RateWindows::Grid));
        assert!(has(&|r| r.qr_echo == QrEcho::AsSent));
        assert!(has(&|r| r.qr_echo == QrEcho::Normalised));
    }
}
