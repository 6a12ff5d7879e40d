package main

import "context"

// runUp is replaced when its package lands.
func runUp(ctx context.Context, args []string) error { return errNotBuilt }
