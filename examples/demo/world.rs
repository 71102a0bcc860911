//! What the demo sees: the board, the cloud's inbox and the daemon's
//! messages, owned by one task ([`World`]), and the cloud's MQTT client.

use super::*;

/// Everything the demo observes, owned by one task: the board is stepped
/// and the cloud's inbox drained in the same loop that waits, so no lock
/// is needed and nothing is missed between a check and a wait.
pub struct World {
    pub sim: SimBoard<pty::Master>,
    /// Held so the pty stays up while the daemon closes and reopens it.
    pub _slave: std::os::fd::OwnedFd,
    pub board_events: Vec<SimEvent>,
    pub inbound: mpsc::Receiver<Inbound>,
    pub client: AsyncClient,
    pub events_topic: String,
    pub cloud: Cloud,
    /// Every event the cloud sent, to answer sync requests.
    pub sent: Vec<SignedEvent>,
    pub hub_public: VerifyingKey,
    pub results: Vec<Value>,
    pub audit: Vec<Value>,
    pub alerts: Vec<Value>,
    pub syncs: Vec<Value>,
    pub online: Vec<String>,
    /// SubAcks the cloud received (one per connection).
    pub subscribed: usize,
    pub verified: usize,
    pub forged: usize,
    /// The broker is down: nothing can reach the cloud.
    pub offline: bool,
    /// Step 8's OSDP reader, when the PyPI libosdp peer is installed.
    pub reader: Option<osdp_peer::Peer>,
}

/// Positions in the observed lists, to look only at what came after.
#[derive(Clone, Copy)]
pub struct Mark {
    pub board: usize,
    pub audit: usize,
    pub syncs: usize,
}

/// What the daemon did with one keypad entry.
pub struct Entry {
    pub door: String,
    /// `Ok(ms)` for an Unlock whose relay opened, `Err(reason)` for a Deny.
    pub decision: Result<u16, u8>,
    /// The entry's audit records at the cloud (empty while offline).
    pub audit: Vec<Value>,
}

impl Entry {
    pub fn audit_kind(&self, i: usize) -> &str {
        self.audit
            .get(i)
            .and_then(|a| a["kind"].as_str())
            .unwrap_or("(none)")
    }

    pub fn expect_opened(&self) -> Result<(), Failure> {
        match self.decision {
            Ok(_) => Ok(()),
            Err(r) => fail(format!(
                "expected door {} to open, the hub sent Deny reason {r}",
                self.door
            )),
        }
    }

    pub fn expect_denied(&self, reason: u8, kind: &str, why: Option<&str>) -> Result<(), Failure> {
        match self.decision {
            Ok(_) => {
                return fail(format!(
                    "expected door {} to stay shut, the relay opened",
                    self.door
                ));
            }
            Err(r) if r != reason => {
                return fail(format!(
                    "expected Deny reason {reason} at door {}, got reason {r}",
                    self.door
                ));
            }
            Err(_) => {}
        }
        let a = self.audit.first().cloned().unwrap_or(Value::Null);
        if a["kind"] != kind || why.is_some_and(|w| a["reason"] != w) {
            return fail(format!(
                "expected audit {kind} {} at door {}, got {}",
                why.unwrap_or(""),
                self.door,
                describe_audit(&a)
            ));
        }
        Ok(())
    }
}

impl World {
    pub fn mark(&self) -> Mark {
        Mark {
            board: self.board_events.len(),
            audit: self.audit.len(),
            syncs: self.syncs.len(),
        }
    }

    /// One turn: step the board (waits at most a few ms for bytes), then
    /// take in whatever reached the cloud.
    pub async fn pump(&mut self) -> Result<(), Failure> {
        self.sim
            .step()
            .await
            .map_err(|e| Failure(format!("the simulated board stopped: {e}")))?;
        self.board_events.extend(self.sim.take_events());
        while let Ok(msg) = self.inbound.try_recv() {
            self.on_inbound(msg).await?;
        }
        Ok(())
    }

    pub async fn run_for(&mut self, d: Duration) -> Result<(), Failure> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.pump().await?;
        }
        Ok(())
    }

    /// Pumps until `f` gives a value, or fails naming `what` after `limit`.
    pub async fn wait<T>(
        &mut self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&World) -> Option<T>,
    ) -> Result<T, Failure> {
        let end = Instant::now() + limit;
        loop {
            if let Some(v) = f(self) {
                return Ok(v);
            }
            if Instant::now() >= end {
                return fail(format!(
                    "expected {what} within {} s; it did not happen",
                    limit.as_secs()
                ));
            }
            self.pump().await?;
        }
    }

    pub async fn on_inbound(&mut self, msg: Inbound) -> Result<(), Failure> {
        let (topic, payload) = match msg {
            Inbound::Subscribed => {
                self.subscribed += 1;
                return Ok(());
            }
            Inbound::Publish { topic, payload } => (topic, payload),
        };
        let leaf = topic.rsplit('/').next().unwrap_or("");
        if leaf == "status" {
            // Plain JSON, unsigned by contract: a hint, not a record.
            let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
            if let Some(s) = v["state"].as_str() {
                self.online.push(s.to_owned());
            }
            return Ok(());
        }
        if leaf == "events" {
            return Ok(()); // our own publishes, echoed by the wildcard
        }
        let Some(body) = self.open_envelope(&payload) else {
            self.forged += 1;
            say(
                "cloud",
                format!("REFUSED a message on {leaf}: the hub's signature does not verify"),
            );
            return Ok(());
        };
        self.verified += 1;
        match leaf {
            "results" => self.results.push(body),
            "audit" => self.audit.push(body),
            "alerts" => self.alerts.push(body),
            "sync" => {
                self.answer_sync(&body).await?;
                self.syncs.push(body);
            }
            _ => {}
        }
        Ok(())
    }

    /// Verifies a hub envelope with the hub's public key (the key the cloud
    /// registered at provisioning) over the exact body bytes, then parses.
    pub fn open_envelope(&self, payload: &[u8]) -> Option<Value> {
        let body = crypto::open_hub_envelope(payload, HUB_ID, &self.hub_public).ok()?;
        serde_json::from_slice(&body).ok()
    }

    /// A sync request: re-send the events from `from_seq` with their
    /// original ids and bodies, then a checkpoint (mqtt.md 'Seq, gaps').
    pub async fn answer_sync(&mut self, req: &Value) -> Result<(), Failure> {
        let from = req["from_seq"].as_u64().unwrap_or(1);
        let resend: Vec<Vec<u8>> = self
            .sent
            .iter()
            .filter(|e| e.seq.is_some_and(|s| s >= from))
            .map(|e| e.envelope.clone())
            .collect();
        for env in resend {
            self.publish(env).await?;
        }
        let cp = self.cloud.checkpoint();
        self.publish(cp.envelope).await
    }

    pub async fn publish(&self, envelope: Vec<u8>) -> Result<(), Failure> {
        match tokio::time::timeout(
            PUBLISH_WAIT,
            self.client
                .publish(&self.events_topic, QoS::AtLeastOnce, false, envelope),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => fail(format!("the cloud cannot publish: {e}")),
            Err(_) => fail("the cloud's publish queue stayed full for 5 s"),
        }
    }

    /// Publishes a signed event and waits for the hub's result for it.
    pub async fn send(&mut self, ev: SignedEvent) -> Result<Value, Failure> {
        self.publish(ev.envelope.clone()).await?;
        let id = ev.event_id.to_string();
        self.sent.push(ev);
        let r = self
            .wait("the hub's result for the event", STEP_WAIT, |w| {
                w.results
                    .iter()
                    .find(|r| r["event_id"] == id.as_str())
                    .cloned()
            })
            .await?;
        let mut line = format!(
            "result {} (seq {})",
            r["outcome"].as_str().unwrap_or("?"),
            r["seq"]
        );
        if let Some(reason) = r["reason"].as_str() {
            line.push_str(&format!(", reason {reason}"));
        }
        say("hub -> cloud", line);
        Ok(r)
    }

    /// Waits for an audit record of `kind` (for `door` / `key`, if given)
    /// among all received so far, and prints it.
    pub async fn audit_of(
        &mut self,
        kind: &str,
        door: Option<&str>,
        key: Option<&str>,
    ) -> Result<Value, Failure> {
        let a = self
            .wait(&format!("audit {kind}"), STEP_WAIT, |w| {
                w.audit
                    .iter()
                    .find(|a| {
                        a["kind"] == kind
                            && door.is_none_or(|d| a["door"] == d)
                            && key.is_none_or(|k| a["key_id"] == k)
                    })
                    .cloned()
            })
            .await?;
        say("hub -> cloud", format!("audit {}", describe_audit(&a)));
        Ok(a)
    }

    /// Types `pin` and `#` at `door`, then reports what the board got back
    /// (Unlock and the relay, or Deny and its reason) and, while the broker
    /// is up, the entry's audit records at the cloud.
    pub async fn enter(&mut self, door: &str, pin: &str) -> Result<Entry, Failure> {
        let Some(index) = door_index(door) else {
            return fail(format!("no door {door}"));
        };
        // As a person would: wait for the door to lock again first, so the
        // relay opening below is this entry's and not the last one's.
        self.wait(
            &format!("the relay at door {door} to close"),
            STEP_WAIT,
            |w| (!w.sim.relay_open(index)).then_some(()),
        )
        .await?;
        let m = self.mark();
        self.sim.enter_pin(index, pin);
        say("board", format!("typed {pin}# at door {door}"));
        let answer = self
            .wait(&format!("Unlock or Deny at door {door}"), STEP_WAIT, |w| {
                w.board_events[m.board..].iter().find_map(|e| match e {
                    SimEvent::Received(Downlink::Unlock { door: d, ms, .. }) if *d == index => {
                        Some(Ok(*ms))
                    }
                    SimEvent::Received(Downlink::Deny {
                        door: d, reason, ..
                    }) if *d == index => Some(Err(reason.0)),
                    _ => None,
                })
            })
            .await?;
        let decision = match answer {
            Ok(ms) => {
                self.wait(
                    &format!("the relay at door {door} to open"),
                    STEP_WAIT,
                    |w| {
                        w.board_events[m.board..]
                            .contains(&SimEvent::RelayOpened { door: index })
                            .then_some(())
                    },
                )
                .await?;
                say(
                    "board",
                    format!("Unlock for {ms} ms: relay at door {door} opened"),
                );
                Ok(ms)
            }
            Err(reason) => {
                let what = match reason {
                    1 => "denied",
                    2 => "locked out",
                    _ => "unknown reason",
                };
                say("board", format!("Deny reason {reason} ({what})"));
                Err(reason)
            }
        };
        let mut audit = Vec::new();
        if !self.offline {
            let kinds: &[&str] = match decision {
                Ok(_) => &["door.granted", "door.unlocked"],
                Err(_) => &["door.denied"],
            };
            for (i, kind) in kinds.iter().enumerate() {
                let a = self
                    .wait(&format!("audit {kind} for door {door}"), STEP_WAIT, |w| {
                        w.audit[m.audit..]
                            .iter()
                            .filter(|a| {
                                a["door"] == door
                                    && a["kind"].as_str().is_some_and(|k| k.starts_with("door."))
                            })
                            .nth(i)
                            .cloned()
                    })
                    .await?;
                say("hub -> cloud", format!("audit {}", describe_audit(&a)));
                audit.push(a);
            }
        }
        Ok(Entry {
            door: door.to_owned(),
            decision,
            audit,
        })
    }
}

// ---------------------------------------------------------------------------
// The cloud's MQTT client
// ---------------------------------------------------------------------------

pub enum Inbound {
    Subscribed,
    Publish { topic: String, payload: Vec<u8> },
}

/// The cloud's connection: subscribes to everything under the hub on every
/// connection (a restarted rumqttd has forgotten it), and forwards what
/// arrives. It reconnects after a short pause whenever the broker is away.
pub fn cloud_client(
    port: u16,
    filter: &str,
) -> (
    AsyncClient,
    mpsc::Receiver<Inbound>,
    tokio::task::JoinHandle<()>,
) {
    let mut o = MqttOptions::new(CLOUD_CLIENT_ID, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(10))
        .set_clean_session(true)
        .set_credentials(CLOUD_CLIENT_ID, "demo")
        .set_max_packet_size(4 << 20, 4 << 20);
    let (client, mut eventloop) = AsyncClient::new(o, 64);
    let (tx, rx) = mpsc::channel(1024);
    let sub = client.clone();
    let filter = filter.to_owned();
    let task = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    // try_: the poll task must never wait on its own queue.
                    let _ = sub.try_subscribe(filter.clone(), QoS::AtLeastOnce);
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if tx.send(Inbound::Subscribed).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let msg = Inbound::Publish {
                        topic: p.topic.clone(),
                        payload: p.payload.to_vec(),
                    };
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    (client, rx, task)
}
