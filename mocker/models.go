package mocker

import (
	"fmt"
	"net/http"
	"time"
)

// GET /v1/models/{id}, and the model list for Anthropic's clients. The
// two APIs share the paths with different shapes: a request carrying
// anthropic-version (which @anthropic-ai/sdk sends on every request) gets
// Anthropic's (1.16.0, resources/models.d.ts ModelInfo: id, type "model",
// display_name, created_at RFC 3339; the list with data, has_more,
// first_id, last_id), any other OpenAI's (openai 7.60.0,
// resources/models.d.ts Model: id, object "model", created, owned_by),
// and an unknown id a 404 in its client's error shape.

// anthropicClient reports whether r comes from an Anthropic client.
func anthropicClient(r *http.Request) bool { return r.Header.Get("anthropic-version") != "" }

// modelNames are the served names: the base model, then the LoRAs.
func (s *Server) modelNames() []string { return append([]string{s.cfg.Model}, s.cfg.LoRAs...) }

func (s *Server) modelEntry(name string, anthropic bool) map[string]any {
	if anthropic {
		return map[string]any{"id": name, "type": "model", "display_name": name, "created_at": time.Unix(0, 0).UTC().Format(time.RFC3339)}
	}
	m := map[string]any{"id": name, "object": "model", "created": 0, "owned_by": "kvgate", "root": name, "parent": nil}
	if name != s.cfg.Model {
		m["parent"] = s.cfg.Model
	}
	return m
}

// model answers GET /v1/models/{id}.
func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, name := range s.modelNames() {
		if name == id {
			writeJSON(w, 0, s.modelEntry(name, anthropicClient(r)))
			return
		}
	}
	msg := fmt.Sprintf("the model %q does not exist", id)
	if anthropicClient(r) {
		writeAnthropicError(w, http.StatusNotFound, msg)
		return
	}
	writeError(w, http.StatusNotFound, "model_not_found", msg)
}

// anthropicModels is the model list in Anthropic's shape.
func (s *Server) anthropicModels(w http.ResponseWriter) {
	names := s.modelNames()
	data := make([]any, 0, len(names))
	for _, n := range names {
		data = append(data, s.modelEntry(n, true))
	}
	writeJSON(w, 0, map[string]any{"data": data, "has_more": false, "first_id": names[0], "last_id": names[len(names)-1]})
}
