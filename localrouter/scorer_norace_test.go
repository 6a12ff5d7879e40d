//go:build !race

package localrouter

const raceEnabled = false
