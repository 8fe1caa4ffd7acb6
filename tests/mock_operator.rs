//! The mock service's operator endpoints over raw HTTP (reqwest on loopback): one test
//! per rule of spec sections 3, 4, 7 and 8, and one per row of the transition table of
//! section 3. The mock is a second implementation of the spec; these tests hold it to it,
//! so that it refuses what the real service would.

#[cfg(debug_assertions)]
mod common;

mod mock_operator {
    pub mod support;

    mod add_device;
    mod history;
    mod location;
    mod messages;
    mod multi_device;
    mod rate_window;
    mod readings;
    mod test_aids;
    mod transitions;
}
