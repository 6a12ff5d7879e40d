package main

import "context"

// runReplay is replaced when its package lands.
func runReplay(ctx context.Context, args []string) error { return errNotBuilt }
