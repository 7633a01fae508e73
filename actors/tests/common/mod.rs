//! Helpers shared by the actor integration tests.

use std::marker::PhantomData;

use ractor::{Actor, ActorProcessingErr, ActorRef, Message};
use tokio::sync::mpsc;

/// Stands in for a subscriber (a component, the scheduler's client):
/// forwards every message it gets to a channel the test reads.
pub struct Sink<M>(PhantomData<fn() -> M>);

impl<M> Sink<M> {
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<M> Default for Sink<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: Message + Sync> Actor for Sink<M> {
    type Msg = M;
    type State = mpsc::UnboundedSender<M>;
    type Arguments = mpsc::UnboundedSender<M>;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: M,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = tx.send(msg);
        Ok(())
    }
}
