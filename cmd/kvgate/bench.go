package main

import "context"

// runBench is replaced when its package lands.
func runBench(ctx context.Context, args []string) error { return errNotBuilt }
