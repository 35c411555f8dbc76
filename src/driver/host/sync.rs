//! Streams, events and synchronization: copies finish at once, so streams
//! and events are counters that tests check for leaks.

use super::{injected, HostDriver};
use crate::driver::fault::FaultOp;
use crate::driver::{EventId, StreamId};
use crate::error::{Error, Result};

pub(super) fn synchronize(d: &HostDriver) -> Result<()> {
    if d.faults.take(FaultOp::Synchronize) {
        return Err(injected("synchronize"));
    }
    Ok(())
}

pub(super) fn stream_create(d: &HostDriver) -> Result<StreamId> {
    let mut s = d.state();
    let id = s.next_stream;
    s.next_stream += 1;
    s.streams += 1;
    Ok(StreamId(id))
}

pub(super) fn stream_destroy(d: &HostDriver, stream: StreamId) -> Result<()> {
    if stream == StreamId::DEFAULT {
        return Err(Error::InvalidArgument(
            "cannot destroy the default stream".into(),
        ));
    }
    let mut s = d.state();
    s.streams = s.streams.saturating_sub(1);
    Ok(())
}

pub(super) fn event_create(d: &HostDriver) -> Result<EventId> {
    let mut s = d.state();
    let id = s.next_event;
    s.next_event += 1;
    s.events += 1;
    Ok(EventId(id))
}

pub(super) fn event_destroy(d: &HostDriver) -> Result<()> {
    let mut s = d.state();
    s.events = s.events.saturating_sub(1);
    Ok(())
}
