package globalrouter

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvgate/kvgate/policies"
)

// Access says which callers get a capability.
type Access string

// Access levels.
const (
	// AccessOff: nobody.
	AccessOff Access = "off"
	// AccessTrusted: trusted callers only (TrustConfig).
	AccessTrusted Access = "trusted"
	// AccessOn: every caller (a closed deployment, a local demo).
	AccessOn Access = "on"
)

func (a Access) valid() bool { return a == AccessOff || a == AccessTrusted || a == AccessOn }

// allows reports whether a caller of the given trust has the capability.
func (a Access) allows(trusted bool) bool {
	return a == AccessOn || a == AccessTrusted && trusted
}

// DefaultTrustHeader carries a caller's trust token.
const DefaultTrustHeader = "x-kvgate-trust"

// TrustConfig says which callers are trusted, and what they may do that
// others may not. A caller is trusted when its request carries
// Header with a token whose SHA-256 is one of TokensSHA256 (compared in
// constant time). The token is a shared secret of the callers that steer
// routing (an internal service, an operator's tooling, a gateway route of
// authenticated admins that adds it); the ext_proc server removes the
// header from every request before it goes upstream, so workers never see
// it. Clients that do not hold a token cannot forge trust, whatever the
// gateway in front lets through.
type TrustConfig struct {
	// Header is the trust token's header (default x-kvgate-trust).
	Header string `yaml:"header"`
	// TokensSHA256 are the hex SHA-256 digests of the trusted tokens
	// (`printf %s "$TOKEN" | sha256sum`): the file holds no secret.
	TokensSHA256 []string `yaml:"tokens_sha256"`
	// Steering: who may send the headers that steer routing: pins
	// (x-kvgate-pool, x-kvgate-worker-id, x-kvgate-dp-rank), priority,
	// SLO targets and cost overrides. Others get 403. Default trusted.
	Steering Access `yaml:"steering"`
	// RoutingHeaders: who gets the routing headers on the response
	// (x-kvgate-pool, -worker-id, -dp-rank, -overlap-blocks, -endpoint,
	// x-prefiller-host-port, x-kvgate-explain): they tell a client what
	// the cache holds, an oracle for other tenants' prompts. Default off.
	RoutingHeaders Access `yaml:"routing_headers"`
	// Objectives: who may name an InferenceObjective
	// (x-gateway-inference-objective) and so choose its priority. Default
	// (unset) on: any caller, as the Inference Extension's endpoint picker
	// takes it from any request; the objectives it can name are the
	// operator's (flow_control.objectives). trusted or off answer others
	// 403. Read only when flow_control names objectives.
	Objectives Access `yaml:"objectives"`

	digests [][]byte
}

func (t *TrustConfig) defaults() {
	if t.Header == "" {
		t.Header = DefaultTrustHeader
	}
	t.Header = strings.ToLower(t.Header)
	if t.Steering == "" {
		t.Steering = AccessTrusted
	}
	if t.RoutingHeaders == "" {
		t.RoutingHeaders = AccessOff
	}
}

func (t *TrustConfig) validate(file string) error {
	if !t.Steering.valid() {
		return fmt.Errorf("%s: %w: trust.steering %q: want off, trusted or on", file, policies.ErrConfig, t.Steering)
	}
	if t.Objectives != "" && !t.Objectives.valid() {
		return fmt.Errorf("%s: %w: trust.objectives %q: want off, trusted or on", file, policies.ErrConfig, t.Objectives)
	}
	if !t.RoutingHeaders.valid() {
		return fmt.Errorf("%s: %w: trust.routing_headers %q: want off, trusted or on", file, policies.ErrConfig, t.RoutingHeaders)
	}
	t.digests = nil
	for i, d := range t.TokensSHA256 {
		b, err := hex.DecodeString(strings.TrimSpace(d))
		if err != nil || len(b) != sha256.Size {
			return fmt.Errorf("%s: %w: trust.tokens_sha256[%d]: want 64 hex digits (a SHA-256)", file, policies.ErrConfig, i)
		}
		t.digests = append(t.digests, b)
	}
	return nil
}

// objectivesAllow reports whether a caller of the given trust may name an
// objective (unset: anyone).
func (t *TrustConfig) objectivesAllow(trusted bool) bool {
	return t.Objectives == "" || t.Objectives.allows(trusted)
}

// trusted reports whether the request's headers carry a trusted token.
func (t *TrustConfig) trusted(h map[string]string) bool {
	tok, ok := h[t.Header]
	if !ok || tok == "" || len(t.digests) == 0 {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	found := 0
	for _, d := range t.digests {
		found |= subtle.ConstantTimeCompare(sum[:], d)
	}
	return found == 1
}

// TenancyConfig separates tenants' caches: with Salt, the blocks of a
// request are hashed with a seed of its tenant's own (the value of
// Header), so requests of different tenants never share a block in the
// index, and no tenant can learn from the routing (or its latency)
// whether another tenant's prompt is cached. Requests without the header
// are hashed as before (the shared namespace).
//
// The local routers index what the engines report: salted hashes match
// the index when the blocks were learnt from the router's own decisions
// (approximate mode) or the engine's events carry the same salt: the
// ext_proc server sends the engine the salt as the body's cache_salt
// (Decision.CacheSalt), so the engine partitions its cache the same way
// and its salted events key the same blocks. Against an engine that
// ignores cache_salt a salted tenant gets no overlap (and the engine's
// cache stays shared: docs/security.md).
type TenancyConfig struct {
	// Header names the tenant (e.g. x-tenant, set by the gateway after it
	// authenticated the caller).
	Header string `yaml:"header"`
	// Salt hashes each tenant's blocks with its own seed, and sends the
	// engine that seed's salt as the body's cache_salt
	// (Decision.CacheSalt).
	Salt bool `yaml:"salt"`
	// Identity says where the tenant comes from (identity.go): "trusted"
	// (the default) honours Header only from a trusted caller
	// (TrustConfig: the gateway, having authenticated the client, sets
	// Header and adds the trust token), and refuses any other request
	// that carries it (403 untrusted_header), so a client that forges
	// another tenant's name gets nothing; "on" believes every caller, for
	// a gateway that always overwrites the header itself and never
	// forwards a client's copy; "xfcc" reads it from the client
	// certificate Envoy forwards (XFCC), "jwt-claim" from a claim of the
	// JWT Envoy verified (JWT), both believed only from a trusted Envoy,
	// and standing in for Header (the client's copy counts for nothing).
	Identity Identity `yaml:"identity"`
	// XFCC says which SAN of the client certificate names the tenant
	// (identity xfcc only).
	XFCC *XFCCIdentity `yaml:"xfcc"`
	// JWT names the JWT claim that names the tenant (identity jwt-claim
	// only).
	JWT *JWTIdentity `yaml:"jwt"`
}

func (t *TenancyConfig) validate(where string) error {
	t.Header = strings.ToLower(t.Header)
	if err := t.validateIdentity(where); err != nil {
		return err
	}
	if t.Salt && t.Header == "" {
		return fmt.Errorf("%s: %w: tenancy.salt needs tenancy.header", where, policies.ErrConfig)
	}
	return nil
}

// TenantSaltPrefix begins every tenant's salt, so that no client's
// cache_salt spells one: with salting on, an untenanted request whose
// cache_salt begins with it is refused (ErrBadRequest).
const TenantSaltPrefix = "kvgate-tenant:"

// salt is the cache salt a request's blocks are hashed with
// (kvevents.ChainSeed: Dynamo's salt seed), and, when salted, the
// cache_salt the engine gets (Decision.CacheSalt): the request's own
// cache_salt when salting is off or it has no tenant (tenant);
// otherwise TenantSaltPrefix, the tenant, and, when the client sent a
// cache_salt, a NUL (which no header value holds, so the pair is
// unambiguous) and the client's salt: combined, never dropped. salted
// reports the tenant's part.
func (t *TenancyConfig) salt(tenant, cacheSalt string) (salt string, salted bool, err error) {
	if !t.Salt {
		return cacheSalt, false, nil
	}
	if tenant == "" {
		if strings.HasPrefix(cacheSalt, TenantSaltPrefix) {
			return "", false, fmt.Errorf("%w: cache_salt: a salt beginning %q is reserved for tenants", ErrBadRequest, TenantSaltPrefix)
		}
		return cacheSalt, false, nil
	}
	if !utf8.ValidString(tenant) {
		// JSON (the engine's cache_salt) would read every invalid byte
		// as U+FFFD: two tenants the router keeps apart would meet.
		return "", false, fmt.Errorf("%w: %s: the tenant is not valid UTF-8", ErrBadRequest, t.Header)
	}
	s := TenantSaltPrefix + tenant
	if cacheSalt != "" {
		s += "\x00" + cacheSalt
	}
	return s, true, nil
}
