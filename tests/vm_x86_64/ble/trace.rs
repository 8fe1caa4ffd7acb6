//! An HCI and management trace as the guest's btmon decodes it (`btmon -r`), cut into
//! its records: a header line (`< HCI Command: …`, `> HCI Event: …`, `@ MGMT Event: …
//! {0x0002}`, `= Note: …`) and the lines under it.

pub struct Trace {
    records: Vec<(String, String)>,
}

impl Trace {
    pub fn parse(text: &str) -> Trace {
        let mut records: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if line.starts_with(['<', '>', '@', '=']) {
                records.push((line.to_string(), String::new()));
            } else if let Some((_, body)) = records.last_mut() {
                body.push_str(line.trim());
                body.push('\n');
            }
        }
        Trace { records }
    }

    /// The management socket ids (`{0x0002}`) a process opened.
    fn sockets_of(&self, process: &str) -> Vec<String> {
        let open = format!("@ MGMT Open: {process} ");
        self.records
            .iter()
            .filter(|(h, _)| h.starts_with(&open))
            .filter_map(|(h, _)| Some(h[h.find('{')?..=h.find('}')?].to_string()))
            .collect()
    }

    /// Advertising reports of `mac` from the controller: (adverts, scan responses).
    pub fn hci_reports(&self, mac: &str) -> (usize, usize) {
        let address = format!("Address: {mac}");
        let reports = self
            .records
            .iter()
            .filter(|(h, b)| h.starts_with("> HCI Event: LE Meta Event") && b.contains(&address));
        let (mut adverts, mut responses) = (0, 0);
        for (_, body) in reports {
            if body.contains("SCAN_RSP") {
                responses += 1;
            } else {
                adverts += 1;
            }
        }
        (adverts, responses)
    }

    /// Reports of `mac` the kernel sent `process`'s management socket (Device Found,
    /// 0x0012, and Advertisement Monitor Device Found, 0x002f: by code, as btmon
    /// shortens the names to fit its columns).
    pub fn reports_to(&self, process: &str, mac: &str) -> usize {
        let sockets = self.sockets_of(process);
        let address = format!("Address: {mac}");
        self.records
            .iter()
            .filter(|(h, b)| {
                h.starts_with("@ MGMT Event:")
                    && (h.contains("(0x0012)") || h.contains("(0x002f)"))
                    && sockets.iter().any(|s| h.contains(s.as_str()))
                    && b.contains(&address)
            })
            .count()
    }

    /// The scan types the host set (`Passive`, `Active`) with LE Set Scan Parameters
    /// (0x08|0x000b) or LE Set Extended Scan Parameters (0x08|0x0041), in order.
    pub fn scan_types(&self) -> Vec<&'static str> {
        self.records
            .iter()
            .filter(|(h, _)| {
                h.starts_with("< HCI Command:")
                    && (h.contains("(0x08|0x000b)") || h.contains("(0x08|0x0041)"))
            })
            .flat_map(|(_, b)| {
                b.lines().filter_map(|l| match l {
                    "Type: Passive (0x00)" => Some("Passive"),
                    "Type: Active (0x01)" => Some("Active"),
                    _ => None,
                })
            })
            .collect()
    }

    /// Whether the host sent the command of `opcode` (`0x08|0x0041`).
    pub fn command(&self, opcode: &str) -> bool {
        let opcode = format!("({opcode})");
        self.records
            .iter()
            .any(|(h, _)| h.starts_with("< HCI Command:") && h.contains(&opcode))
    }

    /// Whether any record's header or body has `text`.
    pub fn has(&self, text: &str) -> bool {
        self.records
            .iter()
            .any(|(h, b)| h.contains(text) || b.contains(text))
    }
}
