//! The topics of mqtt.md 'Topics': `P/S/H/leaf`, where `P` is the topic
//! prefix (`mqtt.topic_prefix`, default [`DEFAULT_PREFIX`]), `S` the site id,
//! `H` the hub id and `leaf` one of seven [`Leaf`]s.
//!
//! Built here and parsed here, so the hub, the cloud and the broker's ACL
//! agree on one spelling: the site id as its lowercase hyphenated UUID (what
//! the hub's config holds), the hub id in the id alphabet
//! ([`crate::event::is_key_id`]), nothing after the leaf.

use crate::event::{is_key_id, parse_uuid_strict};
use uuid::Uuid;

/// The topic prefix when the config names none.
pub const DEFAULT_PREFIX: &str = "lockhub/v1";

/// The last segment of a topic: what it carries (mqtt.md's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Leaf {
    /// cloud -> hub: cloud envelopes.
    Events,
    /// hub -> cloud: one result per event received.
    Results,
    /// hub -> cloud: door decisions, key lifecycle.
    Audit,
    /// hub -> cloud: raised and cleared conditions.
    Alerts,
    /// hub -> cloud: sync requests.
    Sync,
    /// hub -> cloud: what the mirror holds.
    Proof,
    /// hub -> cloud: plain JSON, retained; online / offline (the last will).
    Status,
}

impl Leaf {
    pub const ALL: [Leaf; 7] = [
        Leaf::Events,
        Leaf::Results,
        Leaf::Audit,
        Leaf::Alerts,
        Leaf::Sync,
        Leaf::Proof,
        Leaf::Status,
    ];

    /// The topic segment.
    pub fn as_str(self) -> &'static str {
        match self {
            Leaf::Events => "events",
            Leaf::Results => "results",
            Leaf::Audit => "audit",
            Leaf::Alerts => "alerts",
            Leaf::Sync => "sync",
            Leaf::Proof => "proof",
            Leaf::Status => "status",
        }
    }

    /// The segment back to its leaf, exactly (case-sensitive, as MQTT is).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// Whether the cloud publishes it (only `events`); the hub publishes
    /// every other leaf.
    pub fn from_cloud(self) -> bool {
        self == Leaf::Events
    }

    /// Whether its payload is a hub envelope (every hub -> cloud leaf but
    /// `status`, which is plain JSON).
    pub fn is_hub_envelope(self) -> bool {
        !matches!(self, Leaf::Events | Leaf::Status)
    }

    /// Whether it is published retained (only `status`).
    pub fn retained(self) -> bool {
        self == Leaf::Status
    }
}

impl std::fmt::Display for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a topic is not one of the contract's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("not under the topic prefix")]
    Prefix,
    #[error("not prefix/site/hub/leaf")]
    Shape,
    #[error("the site segment is not a lowercase hyphenated UUID")]
    Site,
    #[error("the hub segment is not a hub id")]
    Hub,
    #[error("not one of the seven leaves")]
    Leaf,
}

/// A topic read back by [`parse_topic`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedTopic<'t> {
    pub site_id: Uuid,
    pub hub_id: &'t str,
    pub leaf: Leaf,
}

/// `P/S/H/leaf`.
pub fn topic(prefix: &str, site_id: Uuid, hub_id: &str, leaf: Leaf) -> String {
    format!("{prefix}/{site_id}/{hub_id}/{leaf}")
}

/// Reads `P/S/H/leaf` back, strictly: exactly the prefix, then a site id in
/// the one spelling [`topic`] writes (lowercase hyphenated), a hub id of the
/// id alphabet, one of the seven leaves, and nothing more. An empty segment,
/// a wildcard or a trailing `/` is refused.
pub fn parse_topic<'t>(prefix: &str, topic: &'t str) -> Result<ParsedTopic<'t>, TopicError> {
    let rest = topic
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .ok_or(TopicError::Prefix)?;
    let mut parts = rest.split('/');
    let (Some(site), Some(hub), Some(leaf), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TopicError::Shape);
    };
    let site_id = parse_uuid_strict(site)
        .filter(|u| u.to_string() == site)
        .ok_or(TopicError::Site)?;
    if !is_key_id(hub) {
        return Err(TopicError::Hub);
    }
    let leaf = Leaf::parse(leaf).ok_or(TopicError::Leaf)?;
    Ok(ParsedTopic {
        site_id,
        hub_id: hub,
        leaf,
    })
}

/// One hub's topics: `P/S/H/` built once, a leaf appended per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubTopics {
    /// `P/S/H/`, with the trailing slash.
    base: String,
}

impl HubTopics {
    pub fn new(prefix: &str, site_id: Uuid, hub_id: &str) -> Self {
        HubTopics {
            base: format!("{prefix}/{site_id}/{hub_id}/"),
        }
    }

    /// The topic of one leaf.
    pub fn topic(&self, leaf: Leaf) -> String {
        format!("{}{leaf}", self.base)
    }

    /// `P/S/H/#`: every leaf of this hub (a subscriber's filter).
    pub fn all(&self) -> String {
        format!("{}#", self.base)
    }

    /// The leaf of one of this hub's topics, or `None` for any other topic.
    pub fn leaf_of(&self, topic: &str) -> Option<Leaf> {
        topic.strip_prefix(&self.base).and_then(Leaf::parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";

    fn site() -> Uuid {
        Uuid::parse_str(SITE).unwrap()
    }

    #[test]
    fn the_seven_leaves_are_the_tables_names_and_parse_back() {
        let names: Vec<_> = Leaf::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(
            names,
            [
                "events", "results", "audit", "alerts", "sync", "proof", "status"
            ]
        );
        for l in Leaf::ALL {
            assert_eq!(Leaf::parse(l.as_str()), Some(l));
        }
        assert_eq!(Leaf::parse("Events"), None);
        assert_eq!(Leaf::parse(""), None);
    }

    #[test]
    fn only_events_come_from_the_cloud_and_only_status_is_plain_and_retained() {
        for l in Leaf::ALL {
            assert_eq!(l.from_cloud(), l == Leaf::Events, "{l}");
            assert_eq!(l.retained(), l == Leaf::Status, "{l}");
            assert_eq!(
                l.is_hub_envelope(),
                !matches!(l, Leaf::Events | Leaf::Status),
                "{l}"
            );
        }
    }

    #[test]
    fn a_topic_is_prefix_site_hub_and_leaf() {
        assert_eq!(
            topic(DEFAULT_PREFIX, site(), "hub-1", Leaf::Events),
            format!("lockhub/v1/{SITE}/hub-1/events")
        );
        let t = HubTopics::new("acme/lockhub", site(), "hub-1");
        assert_eq!(
            t.topic(Leaf::Status),
            format!("acme/lockhub/{SITE}/hub-1/status")
        );
        assert_eq!(t.all(), format!("acme/lockhub/{SITE}/hub-1/#"));
        for l in Leaf::ALL {
            assert_eq!(t.topic(l), topic("acme/lockhub", site(), "hub-1", l));
            assert_eq!(t.leaf_of(&t.topic(l)), Some(l));
        }
        assert_eq!(
            t.leaf_of(&format!("acme/lockhub/{SITE}/hub-2/events")),
            None
        );
        assert_eq!(
            t.leaf_of(&format!("acme/lockhub/{SITE}/hub-1/events/x")),
            None
        );
    }

    #[test]
    fn every_topic_built_parses_back_into_its_site_hub_and_leaf() {
        for l in Leaf::ALL {
            let t = topic(DEFAULT_PREFIX, site(), "hub.lobby_1", l);
            assert_eq!(
                parse_topic(DEFAULT_PREFIX, &t),
                Ok(ParsedTopic {
                    site_id: site(),
                    hub_id: "hub.lobby_1",
                    leaf: l
                })
            );
        }
    }

    #[test]
    fn parsing_refuses_anything_but_the_one_spelling() {
        let p = DEFAULT_PREFIX;
        let upper = SITE.to_uppercase();
        let cases = [
            (format!("other/v1/{SITE}/hub-1/events"), TopicError::Prefix),
            (
                format!("lockhub/v10/{SITE}/hub-1/events"),
                TopicError::Prefix,
            ),
            (format!("lockhub/v1{SITE}/hub-1/events"), TopicError::Prefix),
            (format!("lockhub/v1/{SITE}/hub-1"), TopicError::Shape),
            (
                format!("lockhub/v1/{SITE}/hub-1/events/"),
                TopicError::Shape,
            ),
            (
                format!("lockhub/v1/{SITE}/hub-1/events/x"),
                TopicError::Shape,
            ),
            (format!("lockhub/v1/{upper}/hub-1/events"), TopicError::Site),
            ("lockhub/v1/+/hub-1/events".to_owned(), TopicError::Site),
            (format!("lockhub/v1/{SITE}/+/events"), TopicError::Hub),
            (format!("lockhub/v1/{SITE}//events"), TopicError::Hub),
            (format!("lockhub/v1/{SITE}/hub 1/events"), TopicError::Hub),
            (format!("lockhub/v1/{SITE}/hub-1/#"), TopicError::Leaf),
            (format!("lockhub/v1/{SITE}/hub-1/Events"), TopicError::Leaf),
        ];
        for (t, want) in cases {
            assert_eq!(parse_topic(p, &t), Err(want), "{t}");
        }
    }
}
