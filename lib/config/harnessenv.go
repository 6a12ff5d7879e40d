package config

// The KVGATE_* variables of internal/loadbench's child processes and
// benchmark sizes. loadbench reads them by these names, so that
// NotFlagVariables, which Parse does not warn about, is their one list
// (TestNotFlagVariablesListed fails on a KVGATE_* literal in loadbench or
// a KVGATE_* variable read with os.Getenv anywhere but listed nowhere).
const (
	// EnvAAServer marks TestActiveActive's child process; EnvAAPools
	// lists its pools (name=address, comma-separated), EnvAAProbe is
	// its probe configuration as YAML.
	EnvAAServer = "KVGATE_AA_SERVER"
	EnvAAPools  = "KVGATE_AA_POOLS"
	EnvAAProbe  = "KVGATE_AA_PROBE"
	// EnvActiveActiveRuns is TestActiveActive's bursts per row.
	EnvActiveActiveRuns = "KVGATE_ACTIVE_ACTIVE_RUNS"
	// EnvDecisionServer marks the decision bench's server process;
	// EnvDecisionServerProfile names its profile's file; the others are
	// its commit mode, probe configuration file and sizes.
	EnvDecisionServer        = "KVGATE_DECISION_SERVER"
	EnvDecisionServerProfile = "KVGATE_DECISION_SERVER_PROFILE"
	EnvDecisionCommit        = "KVGATE_DECISION_COMMIT"
	EnvDecisionProbeFile     = "KVGATE_DECISION_PROBE_FILE"
	EnvDecisionPools         = "KVGATE_DECISION_POOLS"
	EnvDecisionWorkers       = "KVGATE_DECISION_WORKERS"
	// EnvProbeServer marks the probe bench's server process;
	// EnvProbeServerProfile names its profile's file.
	EnvProbeServer        = "KVGATE_PROBE_SERVER"
	EnvProbeServerProfile = "KVGATE_PROBE_SERVER_PROFILE"
)

// NotFlagVariables are the KVGATE_* variables read by kvgate's tests and
// benchmark harnesses, never by a flag: Parse does not warn about them.
var NotFlagVariables = []string{
	"KVGATE_REQUIRE_TOOLS", "KVGATE_STATIC_BIN", "KVGATE_SDK_DIR", "KVGATE_DOCWALK_TOOLS", "KVGATE_TOKENIZER_CACHE",
	"KVGATE_TOKENIZER_REF", "KVGATE_TEST_ARTIFACTS", "KVGATE_TRUST_TOKEN", "KVGATE_TOKENIZER_NOLEAK", "KVGATE_CRD_REFRESH",
	EnvAAServer, EnvAAPools, EnvAAProbe, EnvActiveActiveRuns,
	EnvDecisionServer, EnvDecisionServerProfile, EnvDecisionCommit, EnvDecisionProbeFile, EnvDecisionPools, EnvDecisionWorkers,
	EnvProbeServer, EnvProbeServerProfile,
}
