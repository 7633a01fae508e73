//! Helpers shared by the actor integration tests.

use fvd_actors::component::ComponentMsg;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc;

/// Stands in for a component: forwards every message it gets to a channel
/// the test reads.
pub struct Sink;

impl Actor for Sink {
    type Msg = ComponentMsg;
    type State = mpsc::UnboundedSender<ComponentMsg>;
    type Arguments = mpsc::UnboundedSender<ComponentMsg>;

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
        msg: ComponentMsg,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = tx.send(msg);
        Ok(())
    }
}
