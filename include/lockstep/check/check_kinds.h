// The per-step check's choices, with their one name table each: how a digest
// is computed (fingerprint.h) and what a divergence does. Apart from
// fingerprint.h so that plain-data headers (the config) need no ATen.
#pragma once

#include "lockstep/util/names.h"

namespace lockstep {

enum class DigestMode { kAuto, kXxh3, kChecksum, kSha256 };
inline constexpr NameTable<DigestMode, 4> kDigestModeNames{{{DigestMode::kAuto, "auto"},
                                                            {DigestMode::kXxh3, "xxh3"},
                                                            {DigestMode::kChecksum, "checksum"},
                                                            {DigestMode::kSha256, "sha256"}}};

enum class CheckPolicy { kAbort, kWarn, kResync };
inline constexpr NameTable<CheckPolicy, 3> kCheckPolicyNames{{{CheckPolicy::kAbort, "abort"},
                                                              {CheckPolicy::kWarn, "warn"},
                                                              {CheckPolicy::kResync, "resync"}}};

// check.on_corruption: what a rank caught computing a wrong local gradient
// does (check/corruption.h): the job stops naming it, or the step is taken
// again on every rank.
enum class OnCorruption { kStop, kSkip };
inline constexpr NameTable<OnCorruption, 2> kOnCorruptionNames{
    {{OnCorruption::kStop, "stop"}, {OnCorruption::kSkip, "skip"}}};

}  // namespace lockstep
