// Package config is how kvgate's processes read their configuration, in one
// style for every subcommand:
//
//   - Files are YAML decoded strictly (ParseFile, DecodeStrict): an unknown
//     field is an error, and every error is a *PosError naming the file, the
//     line and column, and what was being configured ("file:3:5: pools[0]:
//     unknown field ..."). Every such error wraps ErrInvalid.
//   - Flags are a FlagSet: each flag -foo-bar is also read from the
//     environment variable KVGATE_FOO_BAR (command line first, then the
//     environment, then the default), plus any extra names registered with
//     Env (Dynamo's DYN_* aliases of the router knobs). Errors name the flag
//     or the variable at fault. A flag given (Given: on the command line or
//     from the environment) that the running configuration does not read
//     is refused (NotRead) or warned about (WarnNotRead), naming why; a
//     KVGATE_* variable of the environment that sets no flag of the
//     subcommand (another's, a misspelling) is warned about at Parse
//     (NotFlagVariables, the tests' and harnesses', excepted).
//   - A configuration type T follows one convention: `func (T) Defaults() T`
//     returns a copy with every unset field set to its default (so the zero
//     value plus Defaults is usable), and `func (T) Validate() error` reports
//     what cannot be honoured, naming the flag or field.
//
// Default addresses shared by several subcommands live here too, so they
// cannot drift apart; every server binds loopback unless told otherwise,
// and a port alone (":9002") means loopback too, for every listen flag
// (ListenAddr, Listen).
//
// Files: defaults.go (PositiveOr: a zero field takes its default),
// flags.go (FlagSet: environment, aliases, deprecated names, typed
// usage; the Value flag types), harnessenv.go (NotFlagVariables, the one
// list of the tests' and harnesses' KVGATE_* variables, and the Env names
// internal/loadbench reads them by), listen.go (ListenAddr, Listen: one meaning
// for each spelling of a listen address), logging.go (Logging: -log-level and
// -log-format), yaml.go (PosError, ParseFile, DecodeStrict, FixFile).
package config

// Default listen addresses. Every one is loopback: binding wider is an
// explicit choice of the operator (a flag).
const (
	// DefaultExtprocAddr is the ext_proc gRPC server's address, where the
	// shipped Envoy bootstrap looks.
	DefaultExtprocAddr = "127.0.0.1:9002"
	// DefaultExtprocAdminAddr is the ext_proc process's admin (metrics)
	// HTTP address.
	DefaultExtprocAdminAddr = "127.0.0.1:9003"
	// DefaultLocalRouterAddr is a local router's gRPC address.
	DefaultLocalRouterAddr = "127.0.0.1:7100"
	// DefaultLocalRouterAdminAddr is a local router's admin (metrics) HTTP
	// address.
	DefaultLocalRouterAdminAddr = "127.0.0.1:9100"
	// DefaultMockerZMQEndpoint is where the mocker's ZMQ KV-event
	// publisher binds.
	DefaultMockerZMQEndpoint = "tcp://127.0.0.1:5557"
)
