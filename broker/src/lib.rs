//! MQTT broker: listeners, sessions, topic -> table mapping. Empty until the broker issue lands.
