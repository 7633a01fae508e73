//! The agent loop's workspace, without actors: [`agent`] (the packet an
//! agent is given, the agent as a subprocess, the handoff it returns, its
//! leftovers after a crash), [`worktree`] (each agent component's git
//! worktree and branch, one commit per attempt) and [`cleanup`] (the gate a
//! pass clears before it counts), [`preset`] (the coding-agent CLIs fvd
//! runs headless behind its model proxy, and what they report) and
//! [`session`] (one attempt behind the proxy: the key, the budgets left,
//! what it spent and why it stopped). The component actor drives them.
//! [`judge`] keeps what decides a component's verdict as the port has it,
//! whatever an attempt did to it. [`commit`] pins the code a port runs and [`identity`] names the
//! repository it comes from. [`gc`] decides which agent worktrees and
//! branches no port needs any more (`fvd gc`).

pub mod agent;
pub mod attempt_caps;
pub mod cleanup;
pub mod commit;
pub mod gc;
pub mod identity;
pub mod judge;
pub mod preset;
pub mod session;
pub mod together;
pub mod worktree;
