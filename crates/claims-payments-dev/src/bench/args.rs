//! `bench`'s arguments and the variants it measures.

use super::*;

/// `claims-payments-dev bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Invocations per variant and phase (fresh, duplicate), split evenly over the rounds.
    #[arg(long, default_value_t = 30_000)]
    pub requests: usize,
    /// Requests in flight at any time (closed loop).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Rounds; each runs every phase of every variant once, in rotating order.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Process starts measured for the start-up time (per configuration).
    #[arg(long, default_value_t = 9)]
    pub starts: usize,
    /// Messages per round-trip measurement (with and without payout, per store).
    #[arg(long, default_value_t = 200)]
    pub sample: usize,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Do not run the Cosmos part even if the emulator is available.
    #[arg(long)]
    pub skip_cosmos: bool,
    /// Do not run the PostgreSQL part even if PostgreSQL's binaries are installed.
    #[arg(long)]
    pub skip_postgres: bool,
    /// Messages per case for the computed Cosmos request units (in-process emulator).
    #[arg(long, default_value_t = 20)]
    pub ru_messages: usize,
    /// Do not pin `serve` and the load generator to separate cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Run only the multi-instance measurement, for each N given (e.g. `1,2,4`): N `serve`
    /// processes against one `cosmos-emulator`, with a sandbox bank.
    #[arg(long, value_delimiter = ',')]
    pub instances: Vec<usize>,
    /// Messages per multi-instance run.
    #[arg(long, default_value_t = 400)]
    pub instance_messages: usize,
    /// Share of the multi-instance messages delivered a second time, at once, to the next
    /// instance (DeliveryCount 2: a redelivery after a lost lock while the first runs).
    #[arg(long, default_value_t = 0.25)]
    pub redelivery_share: f64,
    /// Run only the telemetry overhead measurement (telemetry off beside exported to a
    /// local Application Insights endpoint).
    #[arg(long)]
    pub telemetry_only: bool,
    /// The claims-payments executable to measure (default: this one).
    #[arg(long, hide = true)]
    pub exe: Option<PathBuf>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: BenchArgs,
        }
        Wrapper::parse_from(["bench"]).args
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    Consumer,
    Noop,
    Naive,
}

impl Variant {
    pub(super) const ALL: [Variant; 3] = [Variant::Consumer, Variant::Noop, Variant::Naive];

    pub(super) fn handler(&self) -> &'static str {
        match self {
            Variant::Consumer => "consumer",
            Variant::Noop => "noop",
            Variant::Naive => "naive",
        }
    }

    /// The outcome label a phase's answers must carry.
    pub(super) fn expected(&self, duplicate: bool) -> &'static str {
        match (self, duplicate) {
            (Variant::Noop, _) => "noop",
            (_, false) => "recorded",
            (_, true) => "duplicate",
        }
    }
}
