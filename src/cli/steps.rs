//! Training steps from other processes: the flag `--steps-socket` and the `[steps]` section.
//!
//! ```toml
//! [steps]
//! socket = "/run/gpumon/steps.sock"   # --steps-socket; off when unset
//! every_n = 1                         # report every N-th step (default 1)
//! mode = "0660"                       # the socket file's permissions, octal (default 0660)
//! max_connections = 64                # clients served at once
//! max_connections_per_uid = 16        # clients of one Unix user served at once
//! max_runs_per_uid = 64               # runs one Unix user may hold
//! idle_timeout = "1h"                 # a run with no mark for this long is evicted
//! ```
//! A training process writes one JSON line per step, `{"job":"train","rank":0,"step":42}`, to
//! the socket (protocol: [`crate::core::steps::socket`]); the agent derives per-step GPU
//! figures (`gpumon_training_step`, `gpumon_step_*`, InfluxDB `gpu_step`, a stdout `STEP` line)
//! and counts what it drops in `gpumon_steps_rejected_total{reason}`. The socket file is
//! removed at shutdown; a stale one left by a killed agent is replaced.
//!
//! The library resolves `[steps]`, adds the tracker and serves the socket
//! (`crate::assembly::StepsSocket`); the flag is set onto the section here.

use std::path::PathBuf;

use crate::assembly::config::StepsSection;

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct StepsArgs {
    /// Accept training-step marks on this Unix socket (one JSON line per step:
    /// {"job":"train","rank":0,"step":42}); mode 0660 unless [steps] mode says otherwise.
    #[arg(long, value_name = "PATH")]
    pub steps_socket: Option<PathBuf>,
}

impl StepsArgs {
    /// `--steps-socket`, set onto `[steps]` (the flag wins over the file).
    pub fn onto_config(&self, file: &mut StepsSection) {
        if self.steps_socket.is_some() {
            file.socket.clone_from(&self.steps_socket);
        }
    }
}
