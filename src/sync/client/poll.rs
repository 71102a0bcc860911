//! The poll task: the only code that touches rumqttc's event loop. It
//! turns what the event loop says into [`PollState`] calls and does what
//! they return: hands messages and link events on (never waiting on a full
//! channel), writes the queued PUBACKs itself, sleeps the backoff, logs.

use super::gate::Gate;
use super::state::{Access, ConnAckStep, Loudness, PollState, Refusal, SubAckStep};
use crate::sync::window::{PausedPings, ReceiveWindow};
use rumqttc::{Event, EventLoop, Outgoing, Packet, PubAck, Publish};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};

/// How long writing acks (or a ping) to the socket may take before the
/// connection is considered dead (rumqttc's own flush timeout is its
/// connection timeout).
const ACK_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// An incoming event message, tagged with the connection that delivered it.
#[derive(Debug)]
pub struct Inbound {
    pub epoch: u64,
    pub publish: Publish,
}

/// What the publisher needs to hear from the event loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// CONNACK: a new connection `epoch`; `session_present` as the broker said.
    Connected { epoch: u64, session_present: bool },
    /// The connection `epoch` is gone; nothing queued for it will be sent.
    Lost { epoch: u64 },
    /// rumqttc wrote a publish of ours with this packet id (in request order).
    Sent { epoch: u64, pkid: u16 },
    /// The broker acknowledged our publish with this packet id.
    Acked { epoch: u64, pkid: u16 },
    /// The event loop ended (shutdown).
    Closed,
}

/// What the control task hears about the broker link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkNews {
    /// What the broker (or the hub's check of the broker) said about access.
    Access(Access),
    /// A connection attempt failed, or the connection was lost: the error,
    /// for `lockhub status` (no secret is in it: rumqttc's error, or what
    /// was refused).
    Failed(String),
}

/// Where the poll task forwards what it sees.
pub struct PollSinks {
    pub inbound: mpsc::Sender<Inbound>,
    /// Publisher: Sent / Acked / Connected / Lost.
    pub link: mpsc::Sender<LinkEvent>,
    /// Everyone else who cares about Connected / Lost (sync planner).
    pub session: mpsc::Sender<LinkEvent>,
    /// The control task: refusals and grants (`broker_denied`), failures.
    pub access: mpsc::Sender<LinkNews>,
}

/// What the poll task connects with besides the options it was built with.
pub struct PollSettings {
    /// The hub's events topic, subscribed on every connection.
    pub events_topic: String,
    pub window: ReceiveWindow,
    /// The last will for each reconnect.
    pub will: super::WillSource,
}

/// Messages the poll task has taken from the event loop but not yet handed
/// on. The poll task must never wait on a full channel: if it did, rumqttc
/// would stop reading the socket, PUBACKs would stop arriving, the
/// publisher's window and rumqttc's in-flight slots would stay full, the
/// ingest task's acks could not be queued, and ingest would stop draining
/// the channel the poll task waits on — a deadlock. So it parks what does
/// not fit here and hands it on as capacity frees, while it keeps polling.
///
/// The backlog is bounded by the hub's [`ReceiveWindow`] (reading pauses
/// while it is full); past [`MAX_PARKED`], which the window keeps out of
/// reach, the connection is dropped and the broker redelivers what was
/// unacked.
struct Parked<T> {
    tx: mpsc::Sender<T>,
    queue: VecDeque<T>,
}

/// Beyond this many parked messages the connection is recycled.
const MAX_PARKED: usize = 8192;

impl<T> Parked<T> {
    fn new(tx: mpsc::Sender<T>) -> Self {
        Parked {
            tx,
            queue: VecDeque::new(),
        }
    }

    /// Hands `item` on now if there is room, otherwise parks it (behind
    /// anything parked earlier, so order is kept). `false` when the receiver
    /// is gone.
    fn push(&mut self, item: T) -> bool {
        if self.queue.is_empty() {
            match self.tx.try_send(item) {
                Ok(()) => return true,
                Err(mpsc::error::TrySendError::Full(item)) => self.queue.push_back(item),
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
            }
        } else {
            self.queue.push_back(item);
        }
        true
    }

    fn overflowing(&self) -> bool {
        self.queue.len() > MAX_PARKED
    }

    /// Waits for room for the oldest parked item and sends it. Only polled
    /// while something is parked.
    async fn drain_one(&mut self) -> bool {
        match self.tx.reserve().await {
            Ok(permit) => {
                if let Some(item) = self.queue.pop_front() {
                    permit.send(item);
                }
                true
            }
            Err(_) => false,
        }
    }
}

/// Writes PUBACKs straight to the connection, bypassing rumqttc's request
/// channel (see the module docs). rumqttc keeps no state for an incoming
/// QoS 1 message under manual acks, so there is nothing to update there.
/// `Framed` encodes each packet whole into its write buffer, so these never
/// interleave with rumqttc's own packets, even when a `poll()` was dropped
/// mid-flush: the next flush sends both, in order.
async fn write_acks(eventloop: &mut EventLoop, pkids: &[u16]) -> Result<(), String> {
    let packets: Vec<Packet> = pkids
        .iter()
        .map(|&pkid| Packet::PubAck(PubAck::new(pkid)))
        .collect();
    write_packets(eventloop, packets, "acks").await
}

/// Writes `packets` to the connection and flushes, within
/// [`ACK_WRITE_TIMEOUT`] (for the acks, and the pings of a paused read: see
/// [`crate::sync::window`]).
async fn write_packets(
    eventloop: &mut EventLoop,
    packets: Vec<Packet>,
    what: &str,
) -> Result<(), String> {
    let Some(network) = eventloop.network.as_mut() else {
        return Err(format!("no connection to write {what} on"));
    };
    let io = async {
        for packet in packets {
            network.write(packet).await?;
        }
        network.flush().await
    };
    match tokio::time::timeout(ACK_WRITE_TIMEOUT, io).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("cannot write {what}: {e}")),
        Err(_) => Err(format!("timed out writing {what}")),
    }
}

/// Sleeps until `at` (never returns for `None`; the select guards it).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Logs a refusal by the broker: at warn the first time (and whenever what
/// is refused changes), at debug while the same refusal repeats, so a hub
/// retrying for days does not flood its log.
fn log_refusal(r: &Refusal, topic: &str) {
    let what = r.access.describe();
    let retry_in = r.retry_in;
    if r.repeated {
        tracing::debug!(refused = %what, topic, ?retry_in, "the broker still refuses");
    } else if matches!(r.access, Access::BrokerUntrusted(_)) {
        tracing::warn!(
            refused = %what,
            ?retry_in,
            "the hub does not trust the broker (broker_denied); check mqtt.ca_file, the host in mqtt.url and the broker's certificate"
        );
    } else {
        tracing::warn!(
            refused = %what,
            topic,
            ?retry_in,
            "the broker refused the hub (broker_denied); check its ACL and credentials for this hub's identity"
        );
    }
}

/// Throws away what rumqttc holds for a connection that is gone: its
/// socket state and the requests it drained into `pending` (see the module
/// docs of [`super`]).
fn forget_connection(eventloop: &mut EventLoop) {
    eventloop.clean();
    eventloop.pending.clear();
}

/// Polls the event loop until `stop` turns true and the connection is
/// closed (cleanly by the publisher, or lost). Only forwards; never awaits
/// the client. Stops reading while `window` is full, and writes the acks the
/// [`Gate`] queues, and meanwhile keeps the connection alive itself
/// ([`PausedPings`]). `reconnect` drops the current connection on purpose
/// (the ingest pipeline asks for it after a storage failure, to get the
/// unacked messages redelivered).
pub async fn poll_loop(
    mut eventloop: EventLoop,
    gate: Arc<Gate>,
    sinks: PollSinks,
    settings: PollSettings,
    reconnect: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let PollSettings {
        events_topic,
        window,
        will,
    } = settings;
    enum Step {
        Event(Result<Event, rumqttc::ConnectionError>),
        Kick,
        Stop,
        /// Acks are queued for this connection.
        Acks,
        /// A parked message was handed on (or its receiver is gone).
        Drained(bool),
        /// Time to ask again for the subscription the broker refused.
        Resubscribe,
        /// Reading is paused and the broker must hear from the hub.
        Ping,
    }
    let PollSinks {
        inbound,
        link,
        session,
        access,
    } = sinks;
    let mut inbound = Parked::new(inbound);
    let mut link = Parked::new(link);
    let mut session = Parked::new(session);
    let mut access = Parked::new(access);
    let mut state = PollState::new();
    let mut pings = PausedPings::new(eventloop.mqtt_options.keep_alive());
    // The failure at hand was a refusal, already logged by `log_refusal`.
    let mut refused = false;
    loop {
        let up = state.is_up();
        // While connected, `acks_ready` is always armed, so the select never
        // runs out of branches even with reading paused.
        let reading = state.reading(&window);
        if up && !reading {
            pings.paused(tokio::time::Instant::now());
        } else if pings.resumed() {
            // The answer to rumqttc's last ping was not read because the hub
            // chose not to read: not held against the broker.
            eventloop.state.await_pingresp = false;
        }
        let ping_at = pings.due();
        let resubscribe_at = state.resubscribe_at();
        let step = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s), if !up => Step::Stop,
            _ = reconnect.notified(), if up => Step::Kick,
            _ = gate.acks_ready.notified(), if up => Step::Acks,
            ok = inbound.drain_one(), if !inbound.queue.is_empty() => Step::Drained(ok),
            ok = link.drain_one(), if !link.queue.is_empty() => Step::Drained(ok),
            ok = session.drain_one(), if !session.queue.is_empty() => Step::Drained(ok),
            ok = access.drain_one(), if !access.queue.is_empty() => Step::Drained(ok),
            _ = sleep_until_some(resubscribe_at), if resubscribe_at.is_some() => Step::Resubscribe,
            _ = sleep_until_some(ping_at), if ping_at.is_some() => Step::Ping,
            ev = eventloop.poll(), if reading => Step::Event(ev),
        };
        let failure = match step {
            Step::Stop => break,
            Step::Drained(true) => continue,
            Step::Drained(false) => break,
            Step::Resubscribe => {
                let epoch = state.on_resubscribe_due();
                tracing::debug!("asking again for the refused subscription");
                let _ = gate.subscribe(epoch, &events_topic);
                continue;
            }
            Step::Acks => {
                let pkids = gate.take_acks(state.epoch());
                if pkids.is_empty() {
                    continue;
                }
                match write_acks(&mut eventloop, &pkids).await {
                    Ok(()) => {
                        state.on_acks_written(&pkids);
                        pings.wrote(tokio::time::Instant::now());
                        continue;
                    }
                    Err(e) => e,
                }
            }
            Step::Ping => {
                match write_packets(&mut eventloop, vec![Packet::PingReq], "a ping").await {
                    Ok(()) => {
                        tracing::debug!(
                            outstanding = state.outstanding(),
                            "pinged the broker while reading is paused"
                        );
                        pings.wrote(tokio::time::Instant::now());
                        continue;
                    }
                    Err(e) => e,
                }
            }
            Step::Event(Ok(_)) if inbound.overflowing() || link.overflowing() => {
                let flow = gate.flow();
                format!(
                    "too many messages waiting for the hub's own tasks ({} events, {} link events; \
                     {} events received and {} acks queued since start)",
                    inbound.queue.len(),
                    link.queue.len(),
                    flow.received,
                    flow.acks_queued
                )
            }
            Step::Kick => "reconnecting to get unacked events redelivered".to_owned(),
            Step::Event(Ok(ev)) => {
                let epoch = state.epoch();
                if matches!(ev, Event::Incoming(_)) {
                    // Any packet from the broker shows the connection alive,
                    // also while a PINGRESP still waits behind the messages
                    // it queued before it (see `window`).
                    eventloop.state.await_pingresp = false;
                }
                match ev {
                    Event::Incoming(Packet::ConnAck(ack)) => {
                        match state.on_connack(ack.session_present) {
                            ConnAckStep::SessionDiscarded => {
                                eventloop.mqtt_options.set_clean_session(false);
                                tracing::warn!(
                                    "discarded the broker session holding an oversized message"
                                );
                                gate.lost(|| forget_connection(&mut eventloop));
                            }
                            ConnAckStep::Up {
                                epoch,
                                session_present,
                            } => {
                                gate.connected(epoch);
                                tracing::info!(epoch, session_present, "mqtt connected");
                                let _ = gate.subscribe(epoch, &events_topic);
                                let ev = LinkEvent::Connected {
                                    epoch,
                                    session_present,
                                };
                                link.push(ev);
                                session.push(ev);
                            }
                        }
                    }
                    Event::Incoming(Packet::Publish(publish)) => {
                        gate.note_received(state.on_publish(&publish));
                        // `false`: the ingest task is gone; so is the daemon.
                        let handed_on = inbound.push(Inbound { epoch, publish });
                        if !handed_on {
                            break;
                        }
                    }
                    Event::Incoming(Packet::PubAck(ack)) => {
                        link.push(LinkEvent::Acked {
                            epoch,
                            pkid: ack.pkid,
                        });
                    }
                    Event::Incoming(Packet::SubAck(ack)) => {
                        let step = state.on_suback(
                            &ack.return_codes,
                            tokio::time::Instant::now(),
                            rand::random(),
                        );
                        match step {
                            SubAckStep::Granted { after_refusal } => {
                                tracing::debug!(codes = ?ack.return_codes, "subscribed");
                                if after_refusal {
                                    tracing::info!(topic = %events_topic, "the broker now grants the subscription");
                                }
                            }
                            SubAckStep::Refused(r) => log_refusal(&r, &events_topic),
                        }
                        access.push(LinkNews::Access(step.access()));
                    }
                    Event::Outgoing(Outgoing::Publish(pkid)) => {
                        link.push(LinkEvent::Sent { epoch, pkid });
                    }
                    Event::Outgoing(Outgoing::Disconnect) => {
                        // Our own clean disconnect (shutdown): stop here, so
                        // rumqttc does not reconnect.
                        state.on_disconnected();
                        gate.lost(|| {});
                        break;
                    }
                    _ => {}
                }
                continue;
            }
            Step::Event(Err(e)) => {
                let step = state.on_connection_error(&e);
                if step.start_clean {
                    eventloop.mqtt_options.set_clean_session(true);
                }
                match step.refusal {
                    Some(r) => {
                        log_refusal(&r, &events_topic);
                        access.push(LinkNews::Access(r.access));
                        refused = true;
                        r.access.describe()
                    }
                    None => e.to_string(),
                }
            }
        };
        let lost = state.on_lost(rand::random());
        gate.lost(|| forget_connection(&mut eventloop));
        access.push(LinkNews::Failed(failure.clone()));
        let loudness = state.on_failure_logged(tokio::time::Instant::now());
        if let Some(epoch) = lost.epoch {
            tracing::warn!(epoch, error = %failure, "mqtt connection lost");
            link.push(LinkEvent::Lost { epoch });
            session.push(LinkEvent::Lost { epoch });
        } else if std::mem::take(&mut refused) {
            // Said by log_refusal.
        } else if let Loudness::Warn { quiet_since } = loudness {
            tracing::warn!(
                error = %failure,
                failed_quietly_since_last = quiet_since,
                retry_in = ?lost.retry_in,
                "cannot reach the broker; retrying (said at most once a minute)"
            );
        } else {
            tracing::debug!(error = %failure, "mqtt connect failed");
        }
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(lost.retry_in) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        // Anything queued while we slept belonged to no connection.
        gate.lost(|| forget_connection(&mut eventloop));
        eventloop.mqtt_options.set_last_will(will());
    }
    // The end is told after everything parked: nothing is lost on the way out.
    while !link.queue.is_empty() && link.drain_one().await {}
    let _ = link.tx.send(LinkEvent::Closed).await;
    while !session.queue.is_empty() && session.drain_one().await {}
    while !inbound.queue.is_empty() && inbound.drain_one().await {}
}
