package vmmw

// #include "vmmweights.h"
import "C"

// cVersion is the version string of the C header.
func cVersion() string { return C.VMMW_VERSION_STRING }

// cValues maps each constant this package declares to the value the C
// header it is compiled against gives it. The constants are written as
// numbers so that go doc shows them; constants_test.go checks they agree.
func cValues() map[string]int64 {
	return map[string]int64{
		"BackendAuto":             C.VMMW_BACKEND_AUTO,
		"BackendHost":             C.VMMW_BACKEND_HOST,
		"BackendCuda":             C.VMMW_BACKEND_CUDA,
		"StatusOK":                C.VMMW_OK,
		"StatusInvalidArgument":   C.VMMW_INVALID_ARGUMENT,
		"StatusNullArgument":      C.VMMW_NULL_ARGUMENT,
		"StatusOutOfMemory":       C.VMMW_OUT_OF_MEMORY,
		"StatusHostOutOfMemory":   C.VMMW_HOST_OUT_OF_MEMORY,
		"StatusDriverUnavailable": C.VMMW_DRIVER_UNAVAILABLE,
		"StatusDriverError":       C.VMMW_DRIVER_ERROR,
		"StatusUnknownPointer":    C.VMMW_UNKNOWN_POINTER,
		"StatusUnknownTag":        C.VMMW_UNKNOWN_TAG,
		"StatusInvalidState":      C.VMMW_INVALID_STATE,
		"StatusCheckpointInvalid": C.VMMW_CHECKPOINT_INVALID,
		"StatusIO":                C.VMMW_IO,
		"StatusPlanMismatch":      C.VMMW_PLAN_MISMATCH,
		"StatusCancelled":         C.VMMW_CANCELLED,
		"StatusPanic":             C.VMMW_PANIC,
		"StatusUnsupported":       C.VMMW_UNSUPPORTED,
		"StatusBufferTooSmall":    C.VMMW_BUFFER_TOO_SMALL,
		"StatusLoadInProgress":    C.VMMW_LOAD_IN_PROGRESS,
		"StatusShareRefused":      C.VMMW_SHARE_REFUSED,
		"StatusShareRevoked":      C.VMMW_SHARE_REVOKED,
		"StatusVersionMismatch":   C.VMMW_VERSION_MISMATCH,
		"StatusUpdateSource":      C.VMMW_UPDATE_SOURCE,
		"StatusUpdateTorn":        C.VMMW_UPDATE_TORN,
		"MemoryDevice":            C.VMMW_UPDATE_DEVICE,
		"MemoryHost":              C.VMMW_UPDATE_HOST,
		"CopyAuto":                C.VMMW_COPY_AUTO,
		"CopyDirect":              C.VMMW_COPY_DIRECT,
		"CopyStaged":              C.VMMW_COPY_STAGED,
		"CopyRead":                C.VMMW_COPY_READ,
		"CopySimple":              C.VMMW_COPY_SIMPLE,
		"AccessNone":              C.VMMW_ACCESS_NONE,
		"AccessRead":              C.VMMW_ACCESS_READ,
		"AccessReadWrite":         C.VMMW_ACCESS_READWRITE,
		"MultiReplicas":           C.VMMW_MULTI_REPLICAS,
		"MultiRanks":              C.VMMW_MULTI_RANKS,
		"Offload":                 C.VMMW_POLICY_OFFLOAD,
		"Discard":                 C.VMMW_POLICY_DISCARD,
		"Reload":                  C.VMMW_POLICY_RELOAD,
		"OffloadCompressed":       C.VMMW_POLICY_OFFLOAD_COMPRESSED,
		"ShareSleepRefuse":        C.VMMW_SHARE_SLEEP_REFUSE,
		"ShareSleepRevoke":        C.VMMW_SHARE_SLEEP_REVOKE,
		"TagDefault":              C.VMMW_TAG_DEFAULT,
		"MetadataUint8":           C.VMMW_METADATA_UINT8,
		"MetadataInt8":            C.VMMW_METADATA_INT8,
		"MetadataUint16":          C.VMMW_METADATA_UINT16,
		"MetadataInt16":           C.VMMW_METADATA_INT16,
		"MetadataUint32":          C.VMMW_METADATA_UINT32,
		"MetadataInt32":           C.VMMW_METADATA_INT32,
		"MetadataFloat32":         C.VMMW_METADATA_FLOAT32,
		"MetadataBool":            C.VMMW_METADATA_BOOL,
		"MetadataString":          C.VMMW_METADATA_STRING,
		"MetadataArray":           C.VMMW_METADATA_ARRAY,
		"MetadataUint64":          C.VMMW_METADATA_UINT64,
		"MetadataInt64":           C.VMMW_METADATA_INT64,
		"MetadataFloat64":         C.VMMW_METADATA_FLOAT64,
	}
}
