//! Events: what happened at one tick (a finding raised or cleared, a training step reported), in a
//! form every event-capable sink writes without knowing the stage behind it.
//!
//! A series says how things are; an event says that something happened, once. Sinks that store
//! events (InfluxDB: one point per event in `<base>_<name>`) write its tags and fields; the
//! terminal prints its [`text`](Event::text). Prometheus and OpenTelemetry metrics have no place
//! for them: they export the stage's series instead.

use std::time::SystemTime;

/// A field value of an event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EventValue<'a> {
    /// An integer.
    Int(i64),
    /// A real number (non-finite values are left out by sinks that cannot store them).
    Float(f64),
    /// A flag.
    Bool(bool),
    /// Text (sinks keep it on one line).
    Str(&'a str),
}

/// One field of an event: its key and value.
pub type EventField<'a> = (&'static str, EventValue<'a>);

/// A per-device part of an event (a step's figures on each GPU it ran on).
#[derive(Clone, Copy, Debug)]
pub struct EventRow<'a> {
    /// The device, as an index into [`Snapshot::devices`](crate::Snapshot::devices).
    pub device: usize,
    /// The device's own fields (added to the event's).
    pub fields: &'a [EventField<'a>],
}

/// How an event hands out its per-device parts: called with a callback that takes each row.
pub type Rows<'a> = dyn Fn(&mut dyn FnMut(EventRow<'_>)) + 'a;

/// [`Event::rows`] of an event without per-device parts.
pub fn no_rows(_: &mut dyn FnMut(EventRow<'_>)) {}

/// One event of one tick, as sinks see it ([`Snapshot::visit_events`](crate::Snapshot::visit_events)).
///
/// Built on the stack by the stage output for the duration of one callback: everything is
/// borrowed, so visiting events allocates nothing.
#[derive(Clone, Copy)]
pub struct Event<'a> {
    /// What happened, lowercase (`"finding"`, `"step"`): InfluxDB's measurement suffix.
    pub name: &'static str,
    /// When it happened. Events of one series within one tick get distinct times.
    pub at: SystemTime,
    /// The device it is about, as an index into [`Snapshot::devices`](crate::Snapshot::devices);
    /// `None` for the host (or when [`rows`](Event::rows) name the devices).
    pub device: Option<usize>,
    /// Labels that identify what the event is about (`kind`, `job`); an empty value means "no
    /// such label" and is left out.
    pub tags: &'a [(&'static str, &'a str)],
    /// Its values.
    pub fields: &'a [EventField<'a>],
    /// Per-device parts, visited on demand: a sink that writes points writes one per row (the
    /// row's device, the event's tags and fields, then the row's fields) instead of one for the
    /// event. [`no_rows`] for an event without.
    pub rows: &'a Rows<'a>,
    /// Writes the event as one human line, without time stamp or line break
    /// (`FINDING raised gpu 0 …`).
    pub text: &'a dyn Fn(&mut String),
}

impl std::fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = String::new();
        (self.text)(&mut text);
        f.debug_struct("Event")
            .field("name", &self.name)
            .field("at", &self.at)
            .field("device", &self.device)
            .field("tags", &self.tags)
            .field("fields", &self.fields)
            .field("rows", &{
                let mut rows = Vec::new();
                (self.rows)(&mut |r| rows.push(format!("{r:?}")));
                rows
            })
            .field("text", &text)
            .finish()
    }
}
