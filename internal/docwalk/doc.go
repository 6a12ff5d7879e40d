// Package docwalk is a test that runs the shell commands of README.md and
// docs/*.md as written, so a document cannot drift from the binary.
//
// The test (walk_test.go) reads every fenced block of those files: a block
// marked sh, bash, shell or console, or an unmarked block whose lines all
// start with a known program or a `$ ` prompt, is a list of commands (in a
// block with `$ ` prompts only the prompted lines are commands; the rest is
// their output). It builds the kvgate binary once, starts one `kvgate up`
// on free ports, and walks each document in its own working folder (the
// repository's top-level entries linked in, plus small fixtures for the
// files a document names but the repository does not ship), in parallel
// with the other documents:
//   - each command's addresses are moved to free ports (127.0.0.1:8080,
//     :8081 and :9002 to the shared `kvgate up`'s gateway, admin and
//     ext_proc; :2379 and :4222 to an etcd and a NATS embedded for that
//     document; any other port to a free one, the same within a document);
//   - `kvgate`, `bin/kvgate` and `go run ./cmd/kvgate` run the built
//     binary; a server (`kvgate localrouter`, `mocker`, `extproc`, `relay`)
//     runs in the background until the document ends and must be listening
//     on its ports before the next command;
//   - every other command runs in bash (pipefail) and must exit 0; a curl
//     that prints its status line must get 2xx unless an expectation says
//     otherwise; expectations (table_test.go, or a
//     `<!-- docwalk: expect "regexp" -->` comment before a block) must
//     match its output.
//
// table_test.go holds every decision: what each program is, the commands
// not run (each with its reason), the commands that stand in for others,
// the fixtures, the expectations, and knownFailing, the commands that fail
// today, each with its error, run and expected to fail (one that passes is
// an error: remove it from the table). A command that matches no rule runs;
// a program the table does not know fails the test, so excluding a new
// command is a conscious edit. A `<!-- docwalk: skip reason -->` comment
// before a block skips that block.
package docwalk
