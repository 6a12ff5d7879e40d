package localrouterv1

// ErrorDomain is the google.rpc.ErrorInfo domain of the service's errors.
// Each error status carries an ErrorInfo with this domain and one of the
// Reason values, so clients can tell errors apart without parsing messages.
const ErrorDomain = "localrouter.kvgate.dev"

// Reasons of the service's errors (ErrorInfo.reason), with their codes.
const (
	ReasonEmptyRequest      = "EMPTY_REQUEST"       // INVALID_ARGUMENT
	ReasonBlockSizeMismatch = "BLOCK_SIZE_MISMATCH" // INVALID_ARGUMENT
	ReasonInvalidConfig     = "INVALID_CONFIG"      // INVALID_ARGUMENT (a bad override)
	ReasonEmptyRequestID    = "EMPTY_REQUEST_ID"    // INVALID_ARGUMENT
	ReasonInvalidArgument   = "INVALID_ARGUMENT"    // INVALID_ARGUMENT (other)
	ReasonUnknownWorker     = "UNKNOWN_WORKER"      // NOT_FOUND
	ReasonUnknownRequest    = "UNKNOWN_REQUEST"     // NOT_FOUND
	ReasonDuplicateRequest  = "DUPLICATE_REQUEST"   // ALREADY_EXISTS
	ReasonNotReady          = "NOT_READY"           // UNAVAILABLE
	ReasonNoWorkers         = "NO_WORKERS"          // UNAVAILABLE
	ReasonClosed            = "CLOSED"              // UNAVAILABLE
	// ReasonNoAllowedWorker: allowed_addresses names none of the pool's
	// workers.
	ReasonNoAllowedWorker = "NO_ALLOWED_WORKER" // FAILED_PRECONDITION
)
