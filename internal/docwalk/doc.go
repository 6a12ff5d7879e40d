// Package docwalk is a test that runs the commands of README.md and
// docs/*.md as written, so a document cannot drift from the binary.
//
// What a command is (extract_test.go):
//   - in a fenced block marked sh, bash, shell or console, or an unmarked
//     block whose lines all start with a program of the table, each
//     command (continuations, quotes and loops followed across lines; a
//     top-level & ends a background command); in a block with `$ `
//     prompts only the prompted lines, the rest being their output;
//   - in the prose, a code span that is a whole command: kvgate (or
//     bin/kvgate, go run ./cmd/kvgate) with an argument after the
//     subcommand, or curl, and no placeholder (…, ..., <x>, an upper-case
//     word such as CONFIG); `kvgate extproc` or `kvgate replay --config
//     CONFIG` name things and are not run.
//
// What the walk does (walk_test.go): it builds kvgate (and each other
// go run package, and the etcdctl stand-in) in one go build, starts one
// `kvgate up` on free ports, and walks each document in parallel with
// the others, in a working folder of its own (the repository's top-level
// entries linked in, plus the fixtures of table_test.go):
//   - addresses move to free ports, the same within a document: a
//     client's 127.0.0.1:8080, :8081 and :9002 reach the shared
//     `kvgate up`; :2379 and :4222 an etcd and a NATS embedded for that
//     document (they stand for the documents' etcd and nats-server); a
//     server's listening addresses, given or default, get ports of their
//     own (defaults through KVGATE_<FLAG>);
//   - a server (kvgate up with flags, extproc, localrouter, mocker,
//     relay) runs in the background until the document ends, and must be
//     listening before the next command and still running at the end; a
//     server of the document on the same address is stopped first;
//   - every other command runs in bash (pipefail; the document's
//     earlier VAR=value lines before it) and must exit 0. Its output must
//     match the table's expectations and a `<!-- docwalk: expect
//     "regexp" -->` comment before its block, and agree with what the
//     document shows it print (the output block right after its block,
//     or its `$ ` prompt's lines): the HTTP status, the X-* and
//     Content-Type header names, data: [DONE], a replay report's columns.
//     A printed HTTP status must be 2xx unless the document shows or
//     expects another. A command with an
//     expectation gets 5 s to settle (a reader is slower than the walk).
//   - replay commands run at most replayCap requests; a `kvgate bench
//     -overload` that sets no window of its own runs with
//     overloadWindows (seconds, not its default half minute); /tmp moves
//     to the document's folder.
//
// table_test.go holds every decision, each with its reason: what each
// program is (run, a tool run where installed, a stand-in, never), the
// commands not run, the stand-ins, the expectations, the fixtures, the
// servers' listening flags, and knownFailing, the commands that fail
// today: the walk runs them and wants them to fail (one that passes is an
// error: remove its row). A command no row excludes runs; a program the
// table does not know, and a row that matches no command, fail the walk,
// so excluding a command is a conscious edit. A `<!-- docwalk: skip
// reason -->` comment before a block skips it.
//
// grpcurl is a tool: mk/docwalk.mk installs it (pinned) for make test and
// sets KVGATE_DOCWALK_TOOLS, under which (or KVGATE_REQUIRE_TOOLS) a
// missing grpcurl fails the walk;
// elsewhere the gRPC calls run where grpcurl is on PATH or in
// .cache/docwalk/bin. etcdctl/ is the walk's stand-in for etcd's etcdctl
// (get, put).
//
// Files: doc.go; extract_test.go (blocks, commands, prose spans);
// walk_test.go (TestDocs, the tables' use, the build, the shared kvgate
// up, the environment); walker_test.go (one document's walk: its folder,
// its addresses and their moves); classify_test.go (what a command runs
// and what the walk does with it); run_test.go (a foreground command and
// the checks of its output); server_test.go (a background server: start,
// readiness, stop); table_test.go (the reviewed tables);
// extract_unit_test.go (the extraction and rewriting rules pinned);
// etcdctl/main.go (the etcdctl stand-in).
package docwalk
