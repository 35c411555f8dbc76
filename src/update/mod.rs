//! Updates: new weights into live destinations.

pub mod transport;
