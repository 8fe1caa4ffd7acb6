/*!
The `ble` source: BLE advertisements heard on one adapter, which BlueZ owns and scans
with (discovery over D-Bus, `Transport: le`, kept alive by the liveness ladder), read
on one of two paths (`scanner.adverts`):

- **mgmt**, the side channel (`mgmt/`): every advertising report straight from the
  kernel's Bluetooth management socket, beside bluetoothd, each with its own RSSI and
  raw advertising data, parsed here. It needs `CAP_NET_ADMIN`; `auto` (the default)
  uses it when it can be opened and the kernel trusts it, and says once at INFO why not
  otherwise; `mgmt` insists (the source cannot work without it: exit 69).
- **dbus**: BlueZ's signals for the adapter's devices, on a connection
  the source reads itself: `InterfacesAdded` (a device object, new or made again after
  BlueZ forgot it: its data is in the signal), `PropertiesChanged` (one advert per
  signal, RSSI and data together), `InterfacesRemoved`. Each advert is completed from
  what this source remembers of the device; a device BlueZ knew before
  the scan is read once at the start (and counts as heard only with an RSSI), and one
  first met in a `PropertiesChanged` is read once from BlueZ.

Both paths give the same [`Advertisement`](crate::record::Advertisement)s, stamped with the wall clock when read.
While adverts flow, the source reads its path at most every [`READ_EVERY`] and takes
everything queued then (up to `EVENTS_PER_TURN` reads a turn): a handful of adverts
per wake-up at dock rates instead of one, a delay of at most [`READ_EVERY`], which no
capture time or batch notices. With nothing to read it waits for the socket, and an idle
dock costs no wake-up.

Adverts that match no product are dropped here when a filter is given (the daemon gives
its products, and those of every SIGHUP reload), and the capture built by that match is
sent on with the advert, so that ingest does not match it again. A radio cannot be
back-pressured: when the channel is full the advert is dropped and counted (logged at
most every 10 s).

`scanner.scan = "passive"` replaces discovery with an advertisement
monitor of the kernel, on the side channel.

A `bluez::Watcher` keeps the health of BlueZ and the adapter current beside the scan,
told by signals, and the liveness ladder turns what it knows, the adverts
heard and the state of the scan into steps: restart the scan, re-acquire the adapter,
give up ([`SourceError::GaveUp`](crate::source::SourceError::GaveUp): the daemon exits 1 and systemd restarts it).
They are taken one by one, each logged once at WARN with the reason; the scanner being back
is logged once at INFO. Counts of restarts and re-acquisitions are logged when the
source ends.

Nothing here ticks. The source wakes for its path (see above), for something the
watcher learned, or at the one deadline the ladder asks for (the end of the silence
allowed, the next step of a trouble): on a dock where all is well and nothing is heard,
it sleeps.

The rooms, each file's doc saying what it holds: the source as the pipeline sees it
([`Ble`]: start, run, report), what it is given, the one loop, what an advert does, the
ladder and its steps, the D-Bus session and adapter, the side channel and a passive
scan's monitor. The source may touch the config, the product table, the clock and the
records, and BlueZ and the kernel.
*/

mod adverts;
mod bluez;
mod devices;
mod ladder;
pub mod mgmt;
mod passive;
mod scanner;
mod session;
mod settings;
mod side;
mod signals;
mod start;
mod steps;

pub use settings::{BleSettings, READ_EVERY};
pub use start::Ble;

#[cfg(test)]
mod tests;
