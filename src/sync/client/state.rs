//! The connection state of the poll task, with no I/O (after rumqttc's own
//! `MqttState`): each method takes what happened on the connection and
//! returns what the poll task must do about it. The poll task ([`super::poll`])
//! does the doing: the socket, the channels, the timers and the log lines.
//!
//! What it keeps: the connection's epoch and whether it is up, the messages
//! received and not yet acked (the hub's receive window), the reconnect and
//! resubscribe backoffs, a session to drop because an oversized message
//! poisoned it, and the last refusal by the broker (so repeats are quieter).

use crate::backoff::Backoff;
use crate::sync::plan::reconnect_backoff;
use crate::sync::window::{Outstanding, ReceiveWindow};
use rumqttc::{ConnectReturnCode, Publish, QoS, SubscribeReasonCode};
use std::time::Duration;
use tokio::time::Instant;
use tokio_rustls::rustls::{self, AlertDescription};

/// What the broker said about the hub's right to be there (mqtt.md
/// 'Broker access'): the control task turns refusals into `broker_denied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The broker refused the connection (CONNACK with this code).
    ConnectRefused(ConnectReturnCode),
    /// The broker ended the TLS handshake with this alert: it refuses the
    /// hub's client certificate (expired, from another CA, revoked). The
    /// identity may be a certificate (mqtt.md 'Broker access'), so this is
    /// a refusal as much as a CONNACK code is.
    CertificateRefused(AlertDescription),
    /// The broker refused the subscription to the events topic (SUBACK 0x80).
    SubscribeRefused,
    /// The broker granted it at QoS 0 only (a broker capped with
    /// `max_qos 0`): events still flow, but none is acked after its commit
    /// or kept for the hub while it is away, so mqtt.md's delivery promise
    /// is gone. Reported like a refusal (`broker_denied`), and asked again.
    SubscribeDowngraded,
    /// The subscription to the events topic was granted.
    Granted,
    /// The hub does not trust the broker: the broker's TLS certificate
    /// failed the hub's checks (mqtt.md 'Broker access'). Not the broker's
    /// word, but as much a reason to raise `broker_denied`: nothing gets
    /// through until an installer fixes a CA, a name or a certificate.
    BrokerUntrusted(Untrusted),
}

/// Why the hub does not trust the broker's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untrusted {
    /// Not signed by the CA in `mqtt.ca_file`.
    UnknownCa,
    /// It does not name the host of `mqtt.url`.
    WrongName,
    Expired,
    NotYetValid,
    Revoked,
    /// Any other failed check (an unsupported algorithm, a bad encoding).
    Other,
}

impl Untrusted {
    fn of(e: &rustls::CertificateError) -> Untrusted {
        use rustls::CertificateError as E;
        match e {
            // A bad signature under a trusted CA's name: another CA that
            // has the same name (two "lockhub CA"s), so still the wrong CA.
            E::UnknownIssuer | E::BadSignature => Untrusted::UnknownCa,
            E::NotValidForName | E::NotValidForNameContext { .. } => Untrusted::WrongName,
            E::Expired | E::ExpiredContext { .. } => Untrusted::Expired,
            E::NotValidYet | E::NotValidYetContext { .. } => Untrusted::NotYetValid,
            E::Revoked => Untrusted::Revoked,
            _ => Untrusted::Other,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Untrusted::UnknownCa => "it is not signed by the CA in mqtt.ca_file",
            Untrusted::WrongName => "it does not name the host in mqtt.url",
            Untrusted::Expired => "it has expired (or the hub's clock is wrong)",
            Untrusted::NotYetValid => "it is not valid yet (or the hub's clock is wrong)",
            Untrusted::Revoked => "it is revoked",
            Untrusted::Other => "it fails the hub's TLS checks",
        }
    }
}

/// The rustls error inside a failed connection, if there is one: directly,
/// or wrapped in the I/O error of the handshake or of the first read (with
/// TLS 1.3 the server judges the client's certificate after the client's
/// side of the handshake is done, so its alert comes with the CONNACK).
fn rustls_error(e: &rumqttc::ConnectionError) -> Option<&rustls::Error> {
    fn of_io(io: &std::io::Error) -> Option<&rustls::Error> {
        io.get_ref()?.downcast_ref::<rustls::Error>()
    }
    match e {
        rumqttc::ConnectionError::Tls(rumqttc::TlsError::TLS(r)) => Some(r),
        rumqttc::ConnectionError::Tls(rumqttc::TlsError::Io(io))
        | rumqttc::ConnectionError::Io(io)
        | rumqttc::ConnectionError::MqttState(
            rumqttc::StateError::Io(io)
            | rumqttc::StateError::Deserialization(rumqttc::mqttbytes::Error::Io(io)),
        ) => of_io(io),
        _ => None,
    }
}

impl Access {
    /// What a failed connection attempt says about access, if anything: a
    /// CONNACK refusal and a TLS alert about the client's certificate are
    /// the broker's word, and a broker certificate the hub refuses is the
    /// hub's; every other failure (TCP, DNS, timeouts) is the network's.
    pub fn of_connection_error(e: &rumqttc::ConnectionError) -> Option<Access> {
        if let rumqttc::ConnectionError::ConnectionRefused(code) = e {
            return Some(Access::ConnectRefused(*code));
        }
        match rustls_error(e)? {
            rustls::Error::AlertReceived(a) if refuses_the_certificate(*a) => {
                Some(Access::CertificateRefused(*a))
            }
            rustls::Error::InvalidCertificate(c) => Some(Access::BrokerUntrusted(Untrusted::of(c))),
            _ => None,
        }
    }

    /// What the SUBACK for the events topic (the only topic the hub
    /// subscribes to) says.
    pub fn of_suback(codes: &[SubscribeReasonCode]) -> Access {
        if codes.is_empty()
            || codes
                .iter()
                .any(|c| !matches!(c, SubscribeReasonCode::Success(_)))
        {
            Access::SubscribeRefused
        } else if codes
            .iter()
            .any(|c| matches!(c, SubscribeReasonCode::Success(QoS::AtMostOnce)))
        {
            Access::SubscribeDowngraded
        } else {
            Access::Granted
        }
    }

    /// For logs: what the broker refused, in the broker's words.
    pub fn describe(self) -> String {
        match self {
            Access::ConnectRefused(ConnectReturnCode::BadUserNamePassword) => {
                "connection refused: bad user name or password".to_owned()
            }
            Access::ConnectRefused(ConnectReturnCode::NotAuthorized) => {
                "connection refused: not authorised".to_owned()
            }
            Access::ConnectRefused(code) => format!("connection refused: {code:?}"),
            Access::CertificateRefused(alert) => {
                format!(
                    "TLS handshake refused: the broker answered {alert:?} to the hub's client certificate"
                )
            }
            Access::SubscribeRefused => "subscription to the events topic refused".to_owned(),
            Access::SubscribeDowngraded => {
                "subscription to the events topic granted at QoS 0 only: events are neither acked after their commit nor kept while the hub is away (the broker's max_qos must be 1 or more)".to_owned()
            }
            Access::Granted => "subscription granted".to_owned(),
            Access::BrokerUntrusted(why) => format!(
                "the broker's TLS certificate is not trusted: {}",
                why.describe()
            ),
        }
    }
}

/// The TLS alerts by which a server refuses a client's certificate.
fn refuses_the_certificate(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
            | AlertDescription::CertificateRequired
    )
}

/// Whether the connection died on an incoming packet over
/// [`MAX_INCOMING_PACKET`](super::MAX_INCOMING_PACKET). With Mosquitto's `max_packet_size` set (as
/// it should be) this never happens; without it, one oversized publish on
/// the events topic would otherwise wedge the hub in a reconnect loop.
fn poisoned_session(e: &rumqttc::ConnectionError) -> bool {
    matches!(
        e,
        rumqttc::ConnectionError::MqttState(rumqttc::StateError::Deserialization(
            rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(_)
        ))
    )
}

/// The poll task's connection state.
#[derive(Debug)]
pub struct PollState {
    /// The current (or last) connection; 0 before the first.
    epoch: u64,
    up: bool,
    /// A message bigger than [`MAX_INCOMING_PACKET`](super::MAX_INCOMING_PACKET) stays at the head of
    /// the persistent session: rumqttc cannot read (or ack) it, so every
    /// reconnect gets it again and the hub would never see another event.
    /// When that happens the session is dropped once, with one clean
    /// connection.
    drop_session: bool,
    /// QoS 1 messages received on this connection and not yet acked.
    outstanding: Outstanding,
    backoff: Backoff,
    /// A refused subscription is asked for again on the same connection
    /// (what the hub publishes may still be allowed), with its own backoff.
    subscribe_backoff: Backoff,
    resubscribe_at: Option<Instant>,
    /// The last refusal reported as new (repeats are quieter).
    last_refusal: Option<Access>,
    /// Failures to reach the broker are logged at warn at most once per
    /// [`FAILURE_LOG_EVERY`]: until this time, they are counted instead.
    quiet_until: Option<Instant>,
    /// Failures not logged at warn since the last warn.
    quiet_failures: u32,
}

/// How often a broker the hub cannot reach is said at warn (mqtt.md
/// 'Broker access': on the first failure, then at most once a minute).
pub const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// How to log a failure to reach the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loudness {
    /// At warn, with how many failures went by quietly since the last warn.
    Warn { quiet_since: u32 },
    /// At debug (a warn was said less than a minute ago).
    Quiet,
}

/// What to do with a CONNACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnAckStep {
    /// This clean connection has discarded the broker's session and the
    /// oversized message with it. Go back to a persistent session at once
    /// (`clean_session = false`), forget what was queued, and do not
    /// subscribe here: the next CONNACK says the session is new, and the
    /// sync planner asks the cloud for everything from W+1
    /// (`fresh_session`), which covers whatever the discarded session held.
    SessionDiscarded,
    /// Connection `epoch` is up: open the gate for it, subscribe (harmless
    /// on a resumed session, needed on a new one), and tell the publisher
    /// and the planner.
    Up { epoch: u64, session_present: bool },
}

/// A refusal by the broker, to be reported (`broker_denied`) and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub access: Access,
    /// The same refusal as the last one reported: log it quietly.
    pub repeated: bool,
    /// When the hub asks again (at most this long, for a log line).
    pub retry_in: Duration,
}

/// What the SUBACK for the events topic means for the poll task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubAckStep {
    /// Granted; `after_refusal` when the last thing reported was a refusal.
    Granted { after_refusal: bool },
    /// Refused: report it; the subscription is asked for again at
    /// [`PollState::resubscribe_at`].
    Refused(Refusal),
}

impl SubAckStep {
    /// What the control task hears.
    pub fn access(self) -> Access {
        match self {
            SubAckStep::Granted { .. } => Access::Granted,
            SubAckStep::Refused(r) => r.access,
        }
    }
}

/// What to do about a failed poll of the event loop (before the loss
/// itself, [`PollState::on_lost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorStep {
    /// Connect the next time with `clean_session = true` (a poisoned
    /// session is dropped).
    pub start_clean: bool,
    /// The broker refused the connection: report it.
    pub refusal: Option<Refusal>,
}

/// A connection (or an attempt) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost {
    /// The connection that was up, if one was (an attempt that failed has
    /// none): tell the publisher and the planner.
    pub epoch: Option<u64>,
    /// Sleep this long before the next attempt.
    pub retry_in: Duration,
}

impl Default for PollState {
    fn default() -> Self {
        Self::new()
    }
}

impl PollState {
    pub fn new() -> Self {
        PollState {
            epoch: 0,
            up: false,
            drop_session: false,
            outstanding: Outstanding::default(),
            backoff: reconnect_backoff(),
            subscribe_backoff: reconnect_backoff(),
            resubscribe_at: None,
            last_refusal: None,
            quiet_until: None,
            quiet_failures: 0,
        }
    }

    /// A connection failed or an attempt did at `now`, for a reason that is
    /// not a refusal (those have [`Refusal::repeated`]): the first since
    /// the hub was last connected is loud, then one a minute.
    pub fn on_failure_logged(&mut self, now: Instant) -> Loudness {
        match self.quiet_until {
            Some(t) if now < t => {
                self.quiet_failures += 1;
                Loudness::Quiet
            }
            _ => {
                self.quiet_until = Some(now + FAILURE_LOG_EVERY);
                Loudness::Warn {
                    quiet_since: std::mem::take(&mut self.quiet_failures),
                }
            }
        }
    }

    /// The current connection's epoch (the last one's while down).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Whether to read the socket: always while connecting; while up, only
    /// until the unacked messages fill `window`.
    pub fn reading(&self, window: &ReceiveWindow) -> bool {
        !self.up || !self.outstanding.full(window)
    }

    /// QoS 1 messages received on this connection and not yet acked.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// When to ask again for a refused subscription, if one was refused on
    /// this connection.
    pub fn resubscribe_at(&self) -> Option<Instant> {
        self.resubscribe_at.filter(|_| self.up)
    }

    /// A CONNACK arrived.
    pub fn on_connack(&mut self, session_present: bool) -> ConnAckStep {
        if self.drop_session {
            self.drop_session = false;
            return ConnAckStep::SessionDiscarded;
        }
        self.epoch += 1;
        self.up = true;
        self.quiet_until = None;
        self.quiet_failures = 0;
        self.outstanding.reset();
        self.backoff.reset();
        self.resubscribe_at = None;
        ConnAckStep::Up {
            epoch: self.epoch,
            session_present,
        }
    }

    /// A message arrived on this connection; returns how many are now
    /// outstanding (a QoS 0 message needs no ack and is not counted).
    pub fn on_publish(&mut self, publish: &Publish) -> usize {
        if publish.qos != QoS::AtMostOnce {
            self.outstanding
                .received(publish.pkid, publish.payload.len());
        }
        self.outstanding.len()
    }

    /// These PUBACKs were written to the connection.
    pub fn on_acks_written(&mut self, pkids: &[u16]) {
        for &pkid in pkids {
            self.outstanding.acked(pkid);
        }
    }

    /// The resubscribe time came: the epoch to subscribe on.
    pub fn on_resubscribe_due(&mut self) -> u64 {
        self.resubscribe_at = None;
        self.epoch
    }

    /// The SUBACK for the events topic arrived at `now`; `random` draws the
    /// jitter of the next attempt if it was refused.
    pub fn on_suback(
        &mut self,
        codes: &[SubscribeReasonCode],
        now: Instant,
        random: u64,
    ) -> SubAckStep {
        match Access::of_suback(codes) {
            Access::Granted => {
                self.subscribe_backoff.reset();
                SubAckStep::Granted {
                    after_refusal: self.last_refusal.take().is_some(),
                }
            }
            refused => {
                let delay = self.subscribe_backoff.next_delay(random);
                self.resubscribe_at = Some(now + delay);
                SubAckStep::Refused(self.note_refusal(refused, delay))
            }
        }
    }

    /// Polling the event loop failed with `e` (the connection is lost, or
    /// the attempt failed; [`PollState::on_lost`] follows).
    pub fn on_connection_error(&mut self, e: &rumqttc::ConnectionError) -> ErrorStep {
        let start_clean = poisoned_session(e);
        if start_clean {
            self.drop_session = true;
        }
        // The delay is only for the log line; the loss that follows takes
        // the same backoff every failed attempt takes.
        let refusal =
            Access::of_connection_error(e).map(|a| self.note_refusal(a, self.backoff.peek()));
        ErrorStep {
            start_clean,
            refusal,
        }
    }

    /// The connection (or the attempt) is over, for whatever reason; the
    /// next attempt waits [`Lost::retry_in`], drawn with `random`.
    pub fn on_lost(&mut self, random: u64) -> Lost {
        let epoch = self.up.then_some(self.epoch);
        self.up = false;
        Lost {
            epoch,
            retry_in: self.backoff.next_delay(random),
        }
    }

    /// The hub's own clean DISCONNECT went out (shutdown).
    pub fn on_disconnected(&mut self) {
        self.up = false;
    }

    fn note_refusal(&mut self, access: Access, retry_in: Duration) -> Refusal {
        let repeated = self.last_refusal == Some(access);
        self.last_refusal = Some(access);
        Refusal {
            access,
            repeated,
            retry_in,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::client::MAX_INCOMING_PACKET;

    #[test]
    fn a_connack_refusal_is_the_brokers_word_and_a_network_failure_is_not() {
        let refused = rumqttc::ConnectionError::ConnectionRefused(ConnectReturnCode::NotAuthorized);
        assert_eq!(
            Access::of_connection_error(&refused),
            Some(Access::ConnectRefused(ConnectReturnCode::NotAuthorized))
        );
        let io = rumqttc::ConnectionError::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ));
        assert_eq!(Access::of_connection_error(&io), None);
        assert_eq!(
            Access::of_connection_error(&rumqttc::ConnectionError::NetworkTimeout),
            None
        );
        let tls = |e| rumqttc::ConnectionError::Tls(rumqttc::TlsError::TLS(e));
        assert_eq!(
            Access::of_connection_error(&tls(rustls::Error::AlertReceived(
                AlertDescription::UnknownCA
            ))),
            Some(Access::CertificateRefused(AlertDescription::UnknownCA)),
            "the broker does not know the hub's certificate"
        );
        assert_eq!(
            Access::of_connection_error(&tls(rustls::Error::AlertReceived(
                AlertDescription::HandshakeFailure
            ))),
            None
        );
    }

    #[test]
    fn a_suback_with_0x80_is_a_refusal_qos_0_a_downgrade_and_qos_1_a_grant() {
        assert_eq!(
            Access::of_suback(&[SubscribeReasonCode::Success(QoS::AtLeastOnce)]),
            Access::Granted
        );
        assert_eq!(
            Access::of_suback(&[SubscribeReasonCode::Success(QoS::ExactlyOnce)]),
            Access::Granted
        );
        // Granted at QoS 0: the delivery promise is gone, so it is reported.
        assert_eq!(
            Access::of_suback(&[SubscribeReasonCode::Success(QoS::AtMostOnce)]),
            Access::SubscribeDowngraded
        );
        assert_eq!(
            Access::of_suback(&[SubscribeReasonCode::Failure]),
            Access::SubscribeRefused
        );
        assert_eq!(Access::of_suback(&[]), Access::SubscribeRefused);
    }

    #[test]
    fn what_was_refused_is_said_in_the_log_line_without_secrets() {
        let s = Access::ConnectRefused(ConnectReturnCode::BadUserNamePassword).describe();
        assert_eq!(s, "connection refused: bad user name or password");
        assert!(Access::SubscribeRefused.describe().contains("events topic"));
    }

    fn publish(pkid: u16, qos: QoS, len: usize) -> Publish {
        let mut p = Publish::new("lockhub/hub-1/events", qos, vec![0u8; len]);
        p.pkid = pkid;
        p
    }

    fn poisoned() -> rumqttc::ConnectionError {
        rumqttc::ConnectionError::MqttState(rumqttc::StateError::Deserialization(
            rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(MAX_INCOMING_PACKET + 1),
        ))
    }

    fn network_down() -> rumqttc::ConnectionError {
        rumqttc::ConnectionError::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    fn granted() -> [SubscribeReasonCode; 1] {
        [SubscribeReasonCode::Success(QoS::AtLeastOnce)]
    }

    #[test]
    fn each_connection_gets_a_new_epoch_and_a_loss_names_the_one_that_was_up() {
        let mut s = PollState::new();
        assert!(!s.is_up());
        assert_eq!(
            s.on_connack(false),
            ConnAckStep::Up {
                epoch: 1,
                session_present: false
            }
        );
        let lost = s.on_lost(0);
        assert_eq!(lost.epoch, Some(1));
        assert!(!s.is_up());
        // A failed attempt while down ends no connection.
        assert_eq!(s.on_lost(0).epoch, None);
        assert_eq!(
            s.on_connack(true),
            ConnAckStep::Up {
                epoch: 2,
                session_present: true
            }
        );
        assert_eq!(s.epoch(), 2);
    }

    #[test]
    fn a_handover_forgets_what_the_old_connection_had_not_acked() {
        let window = ReceiveWindow {
            messages: 2,
            bytes: 1 << 20,
        };
        let mut s = PollState::new();
        assert!(s.reading(&window), "a connecting client reads");
        s.on_connack(true);
        assert_eq!(s.on_publish(&publish(1, QoS::AtLeastOnce, 10)), 1);
        // QoS 0 needs no ack and takes no room.
        assert_eq!(s.on_publish(&publish(0, QoS::AtMostOnce, 10)), 1);
        assert_eq!(s.on_publish(&publish(2, QoS::AtLeastOnce, 10)), 2);
        assert!(!s.reading(&window), "a full window pauses reading");
        s.on_acks_written(&[1]);
        assert!(s.reading(&window));
        s.on_publish(&publish(3, QoS::AtLeastOnce, 10));
        assert!(!s.reading(&window));

        // Lost while full: reading resumes at once (to reconnect), and the
        // next connection starts with nothing outstanding (the broker
        // redelivers the unacked ones).
        s.on_lost(0);
        assert!(s.reading(&window));
        s.on_connack(true);
        assert_eq!(s.outstanding(), 0);
        assert!(s.reading(&window));
        // An ack for a packet id of the old connection changes nothing.
        s.on_publish(&publish(7, QoS::AtLeastOnce, 10));
        s.on_acks_written(&[2]);
        assert_eq!(s.outstanding(), 1);
    }

    #[test]
    fn a_window_of_bytes_pauses_reading_like_a_window_of_messages() {
        let window = ReceiveWindow {
            messages: 100,
            bytes: 1000,
        };
        let mut s = PollState::new();
        s.on_connack(false);
        s.on_publish(&publish(1, QoS::AtLeastOnce, 999));
        assert!(s.reading(&window));
        s.on_publish(&publish(2, QoS::AtLeastOnce, 1));
        assert!(!s.reading(&window));
    }

    #[test]
    fn a_poisoned_session_is_dropped_by_one_clean_connection_then_the_session_is_persistent_again()
    {
        let mut s = PollState::new();
        s.on_connack(true);
        let step = s.on_connection_error(&poisoned());
        assert!(step.start_clean);
        assert_eq!(step.refusal, None);
        assert_eq!(s.on_lost(0).epoch, Some(1));
        // The clean connection's CONNACK opens nothing: no epoch, no
        // subscription, not up.
        assert_eq!(s.on_connack(false), ConnAckStep::SessionDiscarded);
        assert!(!s.is_up());
        assert_eq!(s.epoch(), 1);
        // The next one is the persistent session, new (so the planner
        // asks for everything from W+1).
        assert_eq!(
            s.on_connack(false),
            ConnAckStep::Up {
                epoch: 2,
                session_present: false
            }
        );
        // Only once: a later CONNACK is an ordinary one.
        s.on_lost(0);
        assert!(matches!(
            s.on_connack(true),
            ConnAckStep::Up { epoch: 3, .. }
        ));
    }

    #[test]
    fn an_ordinary_network_failure_keeps_the_session() {
        let mut s = PollState::new();
        s.on_connack(true);
        let step = s.on_connection_error(&network_down());
        assert!(!step.start_clean);
        assert_eq!(step.refusal, None);
        s.on_lost(0);
        assert!(matches!(s.on_connack(true), ConnAckStep::Up { .. }));
    }

    #[test]
    fn reconnect_delays_grow_with_each_failed_attempt_and_start_over_after_a_connack() {
        let mut s = PollState::new();
        // u64::MAX draws near the top of each step; 0 draws 0.
        let mut steps = vec![];
        for _ in 0..6 {
            steps.push(s.backoff.peek());
            let d = s.on_lost(u64::MAX).retry_in;
            assert!(d <= *steps.last().unwrap());
        }
        assert_eq!(
            steps,
            [1, 2, 4, 8, 16, 30].map(Duration::from_secs).to_vec()
        );
        assert_eq!(
            s.on_lost(0).retry_in,
            Duration::ZERO,
            "full jitter reaches 0"
        );
        s.on_connack(true);
        assert_eq!(s.backoff.peek(), crate::sync::plan::RECONNECT_START);
        assert!(s.on_lost(u64::MAX).retry_in <= crate::sync::plan::RECONNECT_START);
    }

    #[test]
    fn a_refused_connection_is_reported_once_loudly_then_quietly_with_the_delay_to_come() {
        let mut s = PollState::new();
        let refused = rumqttc::ConnectionError::ConnectionRefused(ConnectReturnCode::NotAuthorized);
        let first = s.on_connection_error(&refused).refusal.expect("a refusal");
        assert_eq!(
            first,
            Refusal {
                access: Access::ConnectRefused(ConnectReturnCode::NotAuthorized),
                repeated: false,
                retry_in: Duration::from_secs(1),
            }
        );
        s.on_lost(0);
        let again = s.on_connection_error(&refused).refusal.expect("a refusal");
        assert!(again.repeated);
        assert_eq!(
            again.retry_in,
            Duration::from_secs(2),
            "the next backoff step"
        );
        s.on_lost(0);
        // Another refusal is news again.
        let other =
            rumqttc::ConnectionError::ConnectionRefused(ConnectReturnCode::BadUserNamePassword);
        assert!(!s.on_connection_error(&other).refusal.unwrap().repeated);
        // A network failure in between says nothing about access.
        s.on_lost(0);
        assert_eq!(s.on_connection_error(&network_down()).refusal, None);
    }

    #[test]
    fn a_refused_subscription_is_asked_for_again_on_the_same_connection_with_its_own_backoff() {
        let t0 = Instant::now();
        let mut s = PollState::new();
        s.on_connack(true);
        assert_eq!(s.resubscribe_at(), None);
        let step = s.on_suback(&[SubscribeReasonCode::Failure], t0, u64::MAX);
        let SubAckStep::Refused(r) = step else {
            panic!("refused: {step:?}")
        };
        assert_eq!(r.access, Access::SubscribeRefused);
        assert_eq!(step.access(), Access::SubscribeRefused);
        assert!(!r.repeated);
        let at = s.resubscribe_at().expect("asked for again");
        assert!(at <= t0 + Duration::from_secs(1));
        assert_eq!(at, t0 + r.retry_in);
        assert_eq!(s.on_resubscribe_due(), 1, "on this connection");
        assert_eq!(s.resubscribe_at(), None);

        let SubAckStep::Refused(r2) = s.on_suback(&[SubscribeReasonCode::Failure], t0, u64::MAX)
        else {
            panic!("refused again")
        };
        assert!(r2.repeated);
        assert!(r2.retry_in <= Duration::from_secs(2));
        // Not the reconnect backoff: that one is untouched.
        assert_eq!(s.backoff.peek(), Duration::from_secs(1));

        // Granted at last: said once, and the next refusal is news again.
        let step = s.on_suback(&granted(), t0, 0);
        assert_eq!(
            step,
            SubAckStep::Granted {
                after_refusal: true
            }
        );
        assert_eq!(step.access(), Access::Granted);
        assert_eq!(
            s.on_suback(&granted(), t0, 0),
            SubAckStep::Granted {
                after_refusal: false
            }
        );
        assert_eq!(s.subscribe_backoff.peek(), Duration::from_secs(1));
    }

    #[test]
    fn a_pending_resubscription_belongs_to_its_connection() {
        let t0 = Instant::now();
        let mut s = PollState::new();
        s.on_connack(true);
        s.on_suback(&[SubscribeReasonCode::Failure], t0, 0);
        assert!(s.resubscribe_at().is_some());
        s.on_lost(0);
        assert_eq!(s.resubscribe_at(), None, "nothing to ask for while down");
        // The new connection subscribes on its own CONNACK.
        s.on_connack(true);
        assert_eq!(s.resubscribe_at(), None);
    }

    #[test]
    fn an_unreachable_broker_is_loud_on_the_first_failure_then_once_a_minute_and_again_after_a_connection()
     {
        let t0 = Instant::now();
        let mut s = PollState::new();
        assert_eq!(s.on_failure_logged(t0), Loudness::Warn { quiet_since: 0 });
        for i in 1..=5 {
            assert_eq!(
                s.on_failure_logged(t0 + Duration::from_secs(i * 10)),
                Loudness::Quiet
            );
        }
        assert_eq!(
            s.on_failure_logged(t0 + FAILURE_LOG_EVERY),
            Loudness::Warn { quiet_since: 5 },
            "a minute on, with what went by quietly"
        );
        assert_eq!(
            s.on_failure_logged(t0 + FAILURE_LOG_EVERY + Duration::from_secs(1)),
            Loudness::Quiet
        );
        // Connected again: the next outage is news at once.
        s.on_connack(true);
        assert_eq!(
            s.on_failure_logged(t0 + FAILURE_LOG_EVERY + Duration::from_secs(2)),
            Loudness::Warn { quiet_since: 0 }
        );
    }

    #[test]
    fn a_broker_certificate_the_hub_refuses_is_untrusted_with_its_reason() {
        use rustls::CertificateError as E;
        let bad = |c| {
            Access::of_connection_error(&rumqttc::ConnectionError::Tls(rumqttc::TlsError::TLS(
                rustls::Error::InvalidCertificate(c),
            )))
        };
        assert_eq!(
            bad(E::UnknownIssuer),
            Some(Access::BrokerUntrusted(Untrusted::UnknownCa))
        );
        assert_eq!(
            bad(E::NotValidForName),
            Some(Access::BrokerUntrusted(Untrusted::WrongName))
        );
        assert_eq!(
            bad(E::Expired),
            Some(Access::BrokerUntrusted(Untrusted::Expired))
        );
        // Wrapped in the handshake's I/O error, as tokio-rustls reports it.
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(E::UnknownIssuer),
        );
        assert_eq!(
            Access::of_connection_error(&rumqttc::ConnectionError::Tls(rumqttc::TlsError::Io(io))),
            Some(Access::BrokerUntrusted(Untrusted::UnknownCa))
        );
        let said = Access::BrokerUntrusted(Untrusted::WrongName).describe();
        assert!(
            said.contains("not trusted") && said.contains("mqtt.url"),
            "{said}"
        );
    }
}
