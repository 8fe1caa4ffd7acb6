//! The service's addresses and account headers, checked once when a client is made:
//! http(s) URLs with a host (plain http warned of beyond loopback), header values HTTP
//! can carry, and paths appended to a base URL as written. A leaf: it reads URLs and
//! text.

use reqwest::header::HeaderValue;
use url::Url;

use super::ApiError;

/// Whether a URL's scheme is one we can talk to.
pub(super) fn check_http_url(name: &str, url: &Url) -> Result<(), ApiError> {
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() || url.host().is_none() {
        return Err(ApiError::Setup(format!(
            "{name} must be an http(s) URL with a host, got {:?}",
            url.scheme()
        )));
    }
    if url.scheme() == "http" && !is_loopback(url) {
        tracing::warn!(
            url = %url.origin().ascii_serialization(),
            "{name} is plain http: the password and token travel unencrypted"
        );
    }
    Ok(())
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

pub(super) fn header_value(name: &str, value: &str) -> Result<HeaderValue, ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::Setup(format!("{name} is empty")));
    }
    HeaderValue::from_str(value)
        .map_err(|_| ApiError::Setup(format!("{name} holds characters HTTP headers cannot carry")))
}

/// `base` with `segments` appended to its path (a trailing slash of `base` is not
/// doubled; segments are percent-encoded as needed).
pub(crate) fn join(base: &Url, segments: &[&str]) -> Result<Url, ApiError> {
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| ApiError::Setup("base_url cannot have a path".into()))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_appended_to_the_base_url_as_written() {
        for (base, want) in [
            ("https://h/", "https://h/external/v1/devices/decode"),
            ("https://h", "https://h/external/v1/devices/decode"),
            ("https://h/ppe", "https://h/ppe/external/v1/devices/decode"),
            ("https://h/ppe/", "https://h/ppe/external/v1/devices/decode"),
            ("https://h/a/b/", "https://h/a/b/external/v1/devices/decode"),
        ] {
            let url = join(
                &Url::parse(base).unwrap(),
                &["external", "v1", "devices", "decode"],
            )
            .unwrap();
            assert_eq!(url.as_str(), want, "{base}");
        }
        let one = join(
            &Url::parse("https://h/ppe/").unwrap(),
            &["external", "v1", "devices", "AA:BB:CC:DD:EE:FF", "decode"],
        )
        .unwrap();
        assert_eq!(
            one.as_str(),
            "https://h/ppe/external/v1/devices/AA:BB:CC:DD:EE:FF/decode"
        );
    }
}
