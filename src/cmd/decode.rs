//! `tapegate decode`: one packet through the single decode endpoint (spec 4.3), for
//! checking a tape by hand. It touches the service client and the config.

use crate::api::ServiceClient;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::record::Mac;

use super::CmdError;

/// `tapegate decode`: one packet through the single decode endpoint; returns the
/// decoded fields as pretty JSON.
pub async fn decode(
    config: &Config,
    clock: &SharedClock,
    mac: Mac,
    packet: &str,
    product: Option<&str>,
) -> Result<String, CmdError> {
    let service = config.service.as_ref().ok_or(CmdError::NoService)?;
    let client = ServiceClient::new(service, clock.clone())?;
    let mac_id = service.mac_format.format(mac);
    let product = product
        .map(str::to_string)
        .or_else(|| config.products.0.first().map(|p| p.id.to_string()))
        .unwrap_or_else(|| "tape".into());
    let now = clock.wall_ms();
    let correlation_id = format!("{}-decode-{}", config.gateway.id, now);
    let decoded = client
        .decode_one(
            &mac_id,
            &product,
            packet,
            &(now / 1000).to_string(),
            &correlation_id,
        )
        .await?;
    Ok(serde_json::to_string_pretty(&decoded.raw.unwrap_or_default()).unwrap_or_default())
}
