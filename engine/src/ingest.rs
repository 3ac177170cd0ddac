//! From a payload to rows: [`decode`] turns CSV, JSON and line-protocol bodies into rows
//! typed for one table (JSON mappings, inferred schemas for tables made from their first
//! message); [`messages`] is the broker's way in (tables made or widened from JSON, columns
//! fixed by the topic); [`dead_letter`] keeps what did not fit; [`origin`] remembers where a
//! bridged message came from so a redelivery is not stored twice; [`sparkplug`] turns Sparkplug B
//! messages into rows.

pub(crate) mod dead_letter;
pub(crate) mod decode;
pub(crate) mod messages;
pub(crate) mod origin;
pub mod sparkplug;
