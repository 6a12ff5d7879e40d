package kvevents

// SetDumpPageDrop makes p skip sending the pages of its dump answers for
// which drop returns true (a lost page); nil sends every page.
func SetDumpPageDrop(p *Publisher, drop func(page int) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropPage = drop
}
