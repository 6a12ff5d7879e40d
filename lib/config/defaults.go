package config

// PositiveOr sets *v to def when *v is not above zero: a count, a
// duration or a rate left zero (or negative, which means nothing) takes
// its default, the rule of the configuration types whose zero fields take
// those of their DefaultConfig.
func PositiveOr[T ~int | ~int64 | ~float64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
