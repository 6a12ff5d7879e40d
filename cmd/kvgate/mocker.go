package main

import "context"

// runMocker is replaced when its package lands.
func runMocker(ctx context.Context, args []string) error { return errNotBuilt }
