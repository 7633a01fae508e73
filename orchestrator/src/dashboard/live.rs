//! Keeping pages live. A [`Change`] says that a port (or, without a family,
//! anything) changed and when the dashboard learnt it. Beside a live
//! orchestrator the changes come from the `PortEvent` channel that feeds
//! `Watch`; over another process's store, from polling its snapshots. Each
//! open page holds one server-sent-event stream that re-renders the page's
//! live sections on a change (and on a slow tick, for what no event covers:
//! workers joining, times) and sends only the sections whose markup
//! changed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event, KeepAlive, Sse};
use fvd_store::Store;
use fvd_store::messages::PortEvent;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

use super::Dashboard;
use super::html::Section;

/// Something changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The port that changed; `None` for any (a lagged feed).
    pub family: Option<String>,
    /// When the dashboard learnt of it, microseconds since the epoch: the
    /// start of the event → page latency a page reports.
    pub at_us: i64,
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Turns the orchestrator's port events into changes.
pub fn forward(mut events: broadcast::Receiver<PortEvent>) -> broadcast::Sender<Change> {
    let (tx, _) = broadcast::channel(1024);
    let out = tx.clone();
    fvd_telemetry::spawn(async move {
        loop {
            let change = match events.recv().await {
                Ok(ev) => Change::from(&ev),
                Err(broadcast::error::RecvError::Lagged(_)) => Change {
                    family: None,
                    at_us: now_us(),
                },
                Err(broadcast::error::RecvError::Closed) => return,
            };
            // No page open: nobody to tell.
            let _ = out.send(change);
        }
    });
    tx
}

/// Polls `store` every `every` and reports each port whose snapshot
/// changed (and a port that appeared or went away).
pub fn poll(store: Store, every: Duration) -> broadcast::Sender<Change> {
    let (tx, _) = broadcast::channel(1024);
    let out = tx.clone();
    fvd_telemetry::spawn(async move {
        let mut seen: HashMap<String, crate::query::PortSnapshot> = HashMap::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ports = match crate::query::status(&store, None).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "dashboard cannot read the ports");
                    continue;
                }
            };
            let now: HashMap<String, crate::query::PortSnapshot> =
                ports.into_iter().map(|s| (s.family.clone(), s)).collect();
            let at_us = now_us();
            for (family, snap) in &now {
                if seen.get(family) != Some(snap) {
                    let _ = out.send(Change {
                        family: Some(family.clone()),
                        at_us,
                    });
                }
            }
            for family in seen.keys().filter(|f| !now.contains_key(*f)) {
                let _ = out.send(Change {
                    family: Some(family.clone()),
                    at_us,
                });
            }
            seen = now;
        }
    });
    tx
}

#[derive(serde::Serialize)]
struct Update<'a> {
    /// When the change that caused this update reached the dashboard
    /// (µs since the epoch); 0 for the first render and ticks.
    event_us: i64,
    sections: Vec<SectionUpdate<'a>>,
}

#[derive(serde::Serialize)]
struct SectionUpdate<'a> {
    id: &'a str,
    hash: String,
    html: &'a str,
}

/// The event stream of one open page, holding `slot` while it lasts:
/// `render` gives the page's live sections (or `None` when what the page shows is gone); a change of
/// `family` (any change when `None`) or a tick re-renders them.
pub fn sections<F, Fut>(
    dash: Dashboard,
    slot: super::guard::StreamSlot,
    family: Option<String>,
    tick: Duration,
    render: F,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    F: Fn(Dashboard) -> Fut + Send + 'static,
    Fut: Future<Output = Option<Vec<Section>>> + Send,
{
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(16);
    let mut changes = dash.subscribe();
    let keep_alive = KeepAlive::new().interval(dash.shield.keep_alive());
    fvd_telemetry::spawn(async move {
        // The stream's place under the dashboard's caps, given back when
        // the page goes away.
        let _slot = slot;
        let mut sent: HashMap<&'static str, String> = HashMap::new();
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let relevant = |c: &Change| match (&family, &c.family) {
            (Some(want), Some(got)) => want == got,
            _ => true,
        };
        let mut event_us = 0;
        loop {
            let Some(secs) = render(dash.clone()).await else {
                let _ = tx.send(Ok(Event::default().event("gone").data(""))).await;
                return;
            };
            let changed: Vec<SectionUpdate<'_>> = secs
                .iter()
                .filter_map(|s| {
                    let hash = s.hash();
                    (sent.get(s.id) != Some(&hash)).then(|| {
                        sent.insert(s.id, hash.clone());
                        SectionUpdate {
                            id: s.id,
                            hash,
                            html: &s.html,
                        }
                    })
                })
                .collect();
            if !changed.is_empty() {
                let update = Update {
                    event_us,
                    sections: changed,
                };
                let data = serde_json::to_string(&update).unwrap_or_default();
                if tx
                    .send(Ok(Event::default().event("sections").data(data)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            // Wait for the next relevant change, then take every change
            // already queued behind it: one render for a burst.
            event_us = loop {
                tokio::select! {
                    r = changes.recv() => match r {
                        Ok(c) if relevant(&c) => break c.at_us,
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(_)) => break now_us(),
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = interval.tick() => break 0,
                    _ = tx.closed() => return,
                }
            };
            while let Ok(c) = changes.try_recv() {
                if event_us == 0 && relevant(&c) {
                    event_us = c.at_us;
                }
            }
        }
    });
    Sse::new(ReceiverStream::new(rx)).keep_alive(keep_alive)
}
