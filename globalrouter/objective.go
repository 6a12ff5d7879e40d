package globalrouter

import (
	"fmt"
	"os"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/policies"
)

// HeaderObjective names the request's InferenceObjective (its
// metadata.name): the Gateway API Inference Extension's objective
// header, read as its endpoint picker reads it
// (sigs.k8s.io/gateway-api-inference-extension v1.0.0,
// pkg/epp/metadata/consts.go ObjectiveKey; pkg/epp/handlers/request.go
// takes it from any request, and site-src/api-types/inferenceobjective.md
// says "the calling client must set the header"). kvgate has no
// Kubernetes watch: the objectives are configuration
// (flow_control.objectives, objectives_file).
const HeaderObjective = "x-gateway-inference-objective"

// loadObjectives reads flow_control's objectives (its list and its
// objectives_file) into c.objectives; errors at file:line.
func (c *Config) loadObjectives(errs *[]error) {
	fc := &c.FlowControl
	c.objectives = nil
	if len(fc.Objectives) == 0 && fc.ObjectivesFile == "" {
		if c.Trust.Objectives != "" && c.Trust.Objectives.valid() {
			c.failAt(errs, "", "trust.objectives is set but flow_control names no objectives, so nothing reads it")
		}
		return
	}
	c.objectives = make(map[string]int, len(fc.Objectives))
	for i, o := range fc.Objectives {
		// The decoder truncates 1.5 into 1: a priority is an integer.
		if n := config.Field(config.NodeAt(c.at["flow_control:"], "objectives", i), "priority"); n != nil && n.Tag != "!!int" {
			*errs = append(*errs, fmt.Errorf("%s:%d:%d: %w: flow_control.objectives[%d].priority: %q is not an integer", c.file(), n.Line, n.Column, policies.ErrConfig, i, n.Value))
		}
		c.objectives[o.Name] = o.Priority
	}
	if fc.ObjectivesFile == "" {
		return
	}
	data, err := os.ReadFile(fc.ObjectivesFile)
	if err != nil {
		where := c.file()
		if n := config.NodeAt(c.at["flow_control:"], "objectives_file"); n != nil {
			where = fmt.Sprintf("%s:%d:%d", where, n.Line, n.Column)
		}
		*errs = append(*errs, fmt.Errorf("%s: %w: flow_control.objectives_file: %w", where, policies.ErrConfig, err))
		return
	}
	file, err := flowcontrol.ParseObjectives(fc.ObjectivesFile, data, fc.InferencePool)
	if err != nil {
		*errs = append(*errs, err) // config.PosErrors: policies.ErrConfig
		return
	}
	inFile := make(map[string]bool, len(file))
	for _, o := range file {
		inFile[o.Name] = true
	}
	for i, o := range fc.Objectives {
		if inFile[o.Name] {
			where := c.file()
			if n := config.NodeAt(c.at["flow_control:"], "objectives", i); n != nil {
				where = fmt.Sprintf("%s:%d:%d", where, n.Line, n.Column)
			}
			*errs = append(*errs, fmt.Errorf("%s: %w: flow_control.objectives[%d]: objective %q is also in %s", where, policies.ErrConfig, i, o.Name, fc.ObjectivesFile))
		}
	}
	for _, o := range file {
		c.objectives[o.Name] = o.Priority
	}
}

// objectivePriority applies the request's InferenceObjective to hdr: when
// no honoured x-kvgate-priority sets the priority, a request naming an
// objective (HeaderObjective) has that objective's priority; an objective
// not configured is priority 0, as the endpoint picker does (v1.0.0
// pkg/epp/requestcontrol/director.go: "No associated InferenceObjective
// found, using default", defaultPriority 0; an objective without
// spec.priority is 0 too). Who may name one is trust.objectives (default:
// anyone, as the picker). It reports whether the header was present and
// refused for this caller.
func (c *Config) objectivePriority(h map[string]string, hdr *headers, trusted bool) (refused bool) {
	name, ok := h[HeaderObjective]
	if !ok || c.objectives == nil {
		return false
	}
	if !c.Trust.objectivesAllow(trusted) {
		return true
	}
	if h[HeaderPriority] != "" {
		return false // x-kvgate-priority, honoured (Decide refused it otherwise), wins
	}
	hdr.priority = c.objectives[name]
	return false
}
