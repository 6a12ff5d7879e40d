package main

import "context"

// runRelay is replaced when its package lands.
func runRelay(ctx context.Context, args []string) error { return errNotBuilt }
