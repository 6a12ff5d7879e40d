package mocker

import (
	"encoding/json"
	"net/http"
)

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if anthropicClient(r) {
		s.anthropicModels(w)
		return
	}
	data := []any{map[string]any{"id": s.cfg.Model, "object": "model", "created": 0, "owned_by": "kvgate", "root": s.cfg.Model, "parent": nil}}
	for _, l := range s.cfg.LoRAs {
		data = append(data, map[string]any{"id": l, "object": "model", "created": 0, "owned_by": "kvgate", "root": l, "parent": s.cfg.Model})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// tokenize answers vLLM's /tokenize: {"prompt": …} or {"messages": […]}.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string          `json:"model"`
		Prompt   json.RawMessage `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
	}
	body, e := s.readBody(w, r)
	if e == nil {
		e = unmarshal(body, &req)
	}
	if e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	if _, e := s.resolveModel(req.Model); e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	var ids []uint32
	if req.Messages != nil {
		ids, e = s.encodeChat(body)
	} else {
		ids, e = s.promptTokens(req.Prompt)
	}
	if e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids})
}
