/*!
Prometheus remote write 1.0, by hand: the few messages of `prometheus/prompb` that a
push needs, encoded as protobuf, and the exposition `/metrics` serves read back into
series, so that what is pushed is exactly what a scrape would see.
Pure encoding: it touches the records only.

```text
message WriteRequest { repeated TimeSeries timeseries = 1; }
message TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
message Label        { string name = 1; string value = 2; }
message Sample       { double value = 1; int64 timestamp = 2; }   // ms since the epoch
```

Hand-written because no remote-write client crate fits this stack (they read the
`prometheus` crate's registry, or want reqwest 0.13; docs/design.md, "Dependencies"), and for
five fields `prost`'s derive (which needs no `protoc`) is more dependency than code.
The body is then compressed with snappy's block format (`snap::raw`), as the protocol
requires.
*/

use crate::record::EpochMillis;

/// One series of the exposition: its labels (`__name__` among them, sorted by name as
/// the protocol requires) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Why a line of the exposition could not be read (our own output: a bug if it happens).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} of the metrics exposition cannot be read: {why}")]
pub struct ParseError {
    pub line: usize,
    pub why: &'static str,
}

/// Reads the text exposition (Prometheus or OpenMetrics text, as [`crate::metrics`]
/// writes it) into series, adding `extra` labels to each (a label the line already has
/// wins: none of ours are named like these).
pub fn parse_exposition(text: &str, extra: &[(&str, &str)]) -> Result<Vec<Series>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |why| ParseError { line: i + 1, why };
        let name_end = line.find(['{', ' ']).ok_or(err("no value"))?;
        let name = &line[..name_end];
        let mut labels = vec![("__name__".to_string(), name.to_string())];
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let (parsed, after) = parse_labels(inner).ok_or(err("bad labels"))?;
            labels.extend(parsed);
            rest = after;
        }
        // The value, then an optional timestamp (never written by ours).
        let value = rest
            .split_whitespace()
            .next()
            .ok_or(err("no value"))
            .and_then(|v| parse_value(v).ok_or(err("bad value")))?;
        for (k, v) in extra {
            if !labels.iter().any(|(name, _)| name == k) {
                labels.push((k.to_string(), v.to_string()));
            }
        }
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        out.push(Series { labels, value });
    }
    Ok(out)
}

/// `name="value",...}` into labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let name = s[..eq].trim().to_string();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.push((name, value));
        s = &s[end + 1..];
    }
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        v => v.parse().ok(),
    }
}

/// The `WriteRequest` holding each series' value at `at`, uncompressed.
pub fn encode_write_request(series: &[Series], at: EpochMillis) -> Vec<u8> {
    let mut out = Vec::with_capacity(series.len() * 128);
    let mut ts = Vec::new();
    let mut part = Vec::new();
    for s in series {
        ts.clear();
        for (name, value) in &s.labels {
            part.clear();
            bytes_field(&mut part, 1, name.as_bytes());
            bytes_field(&mut part, 2, value.as_bytes());
            bytes_field(&mut ts, 1, &part);
        }
        part.clear();
        // value: field 1, 64-bit; timestamp: field 2, varint (int64: two's complement).
        key(&mut part, 1, 1);
        part.extend_from_slice(&s.value.to_le_bytes());
        key(&mut part, 2, 0);
        varint(&mut part, at as u64);
        bytes_field(&mut ts, 2, &part);
        bytes_field(&mut out, 1, &ts);
    }
    out
}

fn key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire_type)));
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal protobuf reader for the test: (field, wire type, payload) triples.
    fn fields(mut b: &[u8]) -> Vec<(u64, u8, Vec<u8>)> {
        fn read_varint(b: &mut &[u8]) -> u64 {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= u64::from(byte & 0x7F) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let k = read_varint(&mut b);
            let (field, wt) = (k >> 3, (k & 7) as u8);
            let payload = match wt {
                0 => read_varint(&mut b).to_le_bytes().to_vec(),
                1 => {
                    let p = b[..8].to_vec();
                    b = &b[8..];
                    p
                }
                2 => {
                    let n = read_varint(&mut b) as usize;
                    let p = b[..n].to_vec();
                    b = &b[n..];
                    p
                }
                other => panic!("wire type {other}"),
            };
            out.push((field, wt, payload));
        }
        out
    }

    #[test]
    fn the_exposition_is_read_as_prometheus_reads_it() {
        let text = "# HELP tapegate_pending x\n# TYPE tapegate_pending gauge\ntapegate_pending 3\n\
                    tapegate_request_duration_seconds_bucket{le=\"+Inf\"} 7\n\
                    tapegate_build_info{version=\"0.1.0\",note=\"a \\\"q\\\" \\\\ b\\nc, d}\"} 1\n# EOF\n";
        let s = parse_exposition(text, &[("job", "tapegate"), ("gateway", "dock-7")]).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[0].labels,
            [
                ("__name__".into(), "tapegate_pending".into()),
                ("gateway".into(), "dock-7".into()),
                ("job".into(), "tapegate".into()),
            ]
        );
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[1].value, 1.0 * 7.0);
        assert!(s[1].labels.contains(&("le".into(), "+Inf".into())));
        assert!(s[2]
            .labels
            .contains(&("note".into(), "a \"q\" \\ b\nc, d}".into())));
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert!(parse_exposition("tapegate_x{le=\"1\" 3\n", &[]).is_err());
    }

    #[test]
    fn the_whole_live_exposition_reads_as_the_prometheus_parser_reads_it() {
        let m = crate::metrics::Metrics::new();
        m.advert(true);
        let text = m.encode(&crate::outbox::Stats::default(), 1_000).unwrap();
        let ours = parse_exposition(&text, &[]).unwrap();
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let theirs = prometheus_parse::Scrape::parse(lines).unwrap();
        // prometheus-parse folds histograms into one sample each; count the lines.
        let value_lines = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .count();
        assert_eq!(ours.len(), value_lines);
        for sample in &theirs.samples {
            assert!(
                ours.iter()
                    .any(|s| s.labels[0].1.starts_with(&sample.metric)
                        || s.labels
                            .iter()
                            .any(|(k, v)| k == "__name__" && v == &sample.metric)),
                "{} not read",
                sample.metric
            );
        }
    }

    #[test]
    fn a_write_request_is_the_protobuf_prometheus_decodes() {
        let series = vec![Series {
            labels: vec![
                ("__name__".into(), "tapegate_pending".into()),
                ("gateway".into(), "dock-7".into()),
            ],
            value: 2.5,
        }];
        let body = encode_write_request(&series, 1_763_719_200_123);
        let top = fields(&body);
        assert_eq!(top.len(), 1);
        assert_eq!((top[0].0, top[0].1), (1, 2));
        let ts = fields(&top[0].2);
        let labels: Vec<_> = ts.iter().filter(|f| f.0 == 1).collect();
        assert_eq!(labels.len(), 2);
        let l0 = fields(&labels[0].2);
        assert_eq!(l0[0].2, b"__name__");
        assert_eq!(l0[1].2, b"tapegate_pending");
        let sample = fields(&ts.iter().find(|f| f.0 == 2).unwrap().2);
        assert_eq!(sample[0].1, 1);
        assert_eq!(
            f64::from_le_bytes(sample[0].2[..8].try_into().unwrap()),
            2.5
        );
        assert_eq!(
            u64::from_le_bytes(sample[1].2[..8].try_into().unwrap()),
            1_763_719_200_123
        );
        // And the snappy block format round-trips.
        let packed = snap::raw::Encoder::new().compress_vec(&body).unwrap();
        assert_eq!(
            snap::raw::Decoder::new().decompress_vec(&packed).unwrap(),
            body
        );
    }
}
