package mocker

// Model is the model name the server serves (ServerConfig.Model, default
// "mock-model"): what its process registers in etcd.
func (s *Server) Model() string { return s.cfg.Model }
