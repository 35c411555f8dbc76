package vmmw

import "testing"

// Every constant equals the C header's value of the same name.
func TestConstantsMatchTheHeader(t *testing.T) {
	goValues := map[string]int64{
		"BackendAuto":             int64(BackendAuto),
		"BackendHost":             int64(BackendHost),
		"BackendCuda":             int64(BackendCuda),
		"StatusOK":                int64(StatusOK),
		"StatusInvalidArgument":   int64(StatusInvalidArgument),
		"StatusNullArgument":      int64(StatusNullArgument),
		"StatusOutOfMemory":       int64(StatusOutOfMemory),
		"StatusHostOutOfMemory":   int64(StatusHostOutOfMemory),
		"StatusDriverUnavailable": int64(StatusDriverUnavailable),
		"StatusDriverError":       int64(StatusDriverError),
		"StatusUnknownPointer":    int64(StatusUnknownPointer),
		"StatusUnknownTag":        int64(StatusUnknownTag),
		"StatusInvalidState":      int64(StatusInvalidState),
		"StatusCheckpointInvalid": int64(StatusCheckpointInvalid),
		"StatusIO":                int64(StatusIO),
		"StatusPlanMismatch":      int64(StatusPlanMismatch),
		"StatusCancelled":         int64(StatusCancelled),
		"StatusPanic":             int64(StatusPanic),
		"StatusUnsupported":       int64(StatusUnsupported),
		"StatusBufferTooSmall":    int64(StatusBufferTooSmall),
		"StatusLoadInProgress":    int64(StatusLoadInProgress),
		"StatusShareRefused":      int64(StatusShareRefused),
		"StatusShareRevoked":      int64(StatusShareRevoked),
		"StatusVersionMismatch":   int64(StatusVersionMismatch),
		"StatusUpdateSource":      int64(StatusUpdateSource),
		"StatusUpdateTorn":        int64(StatusUpdateTorn),
		"MemoryDevice":            int64(MemoryDevice),
		"MemoryHost":              int64(MemoryHost),
		"CopyAuto":                int64(CopyAuto),
		"CopyDirect":              int64(CopyDirect),
		"CopyStaged":              int64(CopyStaged),
		"CopyRead":                int64(CopyRead),
		"CopySimple":              int64(CopySimple),
		"AccessNone":              int64(AccessNone),
		"AccessRead":              int64(AccessRead),
		"AccessReadWrite":         int64(AccessReadWrite),
		"MultiReplicas":           int64(MultiReplicas),
		"MultiRanks":              int64(MultiRanks),
		"Offload":                 int64(Offload),
		"Discard":                 int64(Discard),
		"Reload":                  int64(Reload),
		"OffloadCompressed":       int64(OffloadCompressed),
		"ShareSleepRefuse":        int64(ShareSleepRefuse),
		"ShareSleepRevoke":        int64(ShareSleepRevoke),
		"TagDefault":              int64(TagDefault),
		"MetadataUint8":           int64(MetadataUint8),
		"MetadataInt8":            int64(MetadataInt8),
		"MetadataUint16":          int64(MetadataUint16),
		"MetadataInt16":           int64(MetadataInt16),
		"MetadataUint32":          int64(MetadataUint32),
		"MetadataInt32":           int64(MetadataInt32),
		"MetadataFloat32":         int64(MetadataFloat32),
		"MetadataBool":            int64(MetadataBool),
		"MetadataString":          int64(MetadataString),
		"MetadataArray":           int64(MetadataArray),
		"MetadataUint64":          int64(MetadataUint64),
		"MetadataInt64":           int64(MetadataInt64),
		"MetadataFloat64":         int64(MetadataFloat64),
	}
	c := cValues()
	if len(c) != len(goValues) {
		t.Fatalf("%d constants checked against %d C values", len(goValues), len(c))
	}
	for name, v := range goValues {
		if c[name] != v {
			t.Errorf("%s = %d, the header says %d", name, v, c[name])
		}
	}
}

func TestHeaderVersionMatchesTheHeader(t *testing.T) {
	if HeaderVersion != cVersion() {
		t.Fatalf("HeaderVersion %q, the header says %q", HeaderVersion, cVersion())
	}
}
