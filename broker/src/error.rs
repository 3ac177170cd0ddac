//! Broker errors, and the one place they become MQTT reason codes.

use rumqttc::v5::mqttbytes::v5::{DisconnectReasonCode, PubAckReason};
use std::path::PathBuf;

/// What can end a connection or refuse a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not an MQTT packet.
    #[error("malformed packet: {0}")]
    Malformed(String),
    /// A well-formed packet that breaks the protocol's rules.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A packet larger than `mqtt.max_packet_size`.
    #[error("packet of {size} bytes is larger than the maximum {max}")]
    PacketTooLarge {
        /// Size announced by the packet.
        size: usize,
        /// The limit.
        max: u32,
    },
    /// More unacknowledged QoS 1/2 publishes than the receive maximum allows.
    #[error("receive maximum {0} exceeded")]
    ReceiveMaximum(u16),
    /// No packet within 1.5 times the keep-alive the client asked for.
    #[error("keep-alive timeout")]
    KeepAlive,
    /// A topic alias that is zero, too large, or unknown.
    #[error("topic alias invalid: {0}")]
    TopicAlias(String),
    /// A packet could not be encoded.
    #[error("encoding a packet: {0}")]
    Encode(String),
    /// Socket I/O.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The log refused a session's record (the disk is full or failing).
    #[error("logging session state: {0}")]
    Log(#[from] sluice_engine::Error),
    /// A listener or certificate could not be set up.
    #[error("{what}: {reason}")]
    Setup {
        /// What was being set up.
        what: String,
        /// Why it failed.
        reason: String,
    },
}

/// What the admin API can get wrong.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// No bridge of that name.
    #[error("no bridge named {0:?}")]
    NotFound(String),
    /// A bridge of that name exists.
    #[error("a bridge named {0:?} exists")]
    Exists(String),
    /// The configuration is not valid.
    #[error("{0}")]
    Invalid(String),
    /// The cluster's metadata group did not take the change.
    #[error("the cluster did not take the change: {0}")]
    Cluster(String),
    /// The saved bridges could not be written.
    #[error("saving {path}: {source}")]
    Save {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The DISCONNECT reason an MQTT 5 client is sent before its connection is closed.
    pub(crate) fn disconnect_reason(&self) -> DisconnectReasonCode {
        match self {
            Error::Malformed(_) | Error::Encode(_) => DisconnectReasonCode::MalformedPacket,
            Error::Protocol(_) => DisconnectReasonCode::ProtocolError,
            Error::PacketTooLarge { .. } => DisconnectReasonCode::PacketTooLarge,
            Error::ReceiveMaximum(_) => DisconnectReasonCode::ReceiveMaximumExceeded,
            Error::KeepAlive => DisconnectReasonCode::KeepAliveTimeout,
            Error::TopicAlias(_) => DisconnectReasonCode::TopicAliasInvalid,
            Error::Io(_) | Error::Setup { .. } | Error::Log(_) => {
                DisconnectReasonCode::UnspecifiedError
            }
        }
    }
}

/// The PUBACK/PUBREC reason for a message the engine refused.
pub(crate) fn store_reason(e: &sluice_engine::Error) -> PubAckReason {
    use sluice_engine::ErrorKind as K;
    match e.kind() {
        K::BadPayload | K::BadRow | K::TooLarge => PubAckReason::PayloadFormatInvalid,
        K::Overloaded | K::BuffersFull | K::DiskFull => PubAckReason::QuotaExceeded,
        K::UnknownTable | K::UnknownDatabase => PubAckReason::TopicNameInvalid,
        K::Denied => PubAckReason::NotAuthorized,
        K::BadSql
        | K::InvalidDefinition
        | K::UnknownAlert
        | K::AlreadyExists
        | K::ShuttingDown
        | K::NotCommitted
        | K::LogUnavailable
        | K::ResourcesExhausted
        | K::QueryFailed
        | K::StorageFailed
        | K::Internal => PubAckReason::UnspecifiedError,
    }
}

/// The numeric value of a PUBACK reason (for logs, metrics and dead letters).
pub(crate) fn reason_code(r: PubAckReason) -> u8 {
    match r {
        PubAckReason::Success => 0x00,
        PubAckReason::NoMatchingSubscribers => 0x10,
        PubAckReason::UnspecifiedError => 0x80,
        PubAckReason::ImplementationSpecificError => 0x83,
        PubAckReason::NotAuthorized => 0x87,
        PubAckReason::TopicNameInvalid => 0x90,
        PubAckReason::PacketIdentifierInUse => 0x91,
        PubAckReason::QuotaExceeded => 0x97,
        PubAckReason::PayloadFormatInvalid => 0x99,
    }
}
