# Writes OUTPUT with the commit of SOURCE_DIR and whether the tree was dirty; rewrites the file
# only when it changes so that an unchanged commit triggers no rebuild.
# COMMIT_OVERRIDE (HARNESS_GIT_COMMIT_OVERRIDE at configure time) wins: the H200 machine builds a
# copy of the tree whose .git, if any, is not the commit being built (dev/gpu/h200_build.sh
# passes the commit dev/gpu/prepare_h200.sh recorded).
if(COMMIT_OVERRIDE)
  set(commit "${COMMIT_OVERRIDE}")
else()
  execute_process(COMMAND git -C ${SOURCE_DIR} rev-parse HEAD
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    execute_process(COMMAND git -C ${SOURCE_DIR} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(dirty)
      set(commit "${commit}-dirty")
    endif()
  elseif(EXISTS ${SOURCE_DIR}/.deps/git_commit)
    # A copy of the tree without .git: dev/gpu/prepare_h200.sh wrote it.
    file(STRINGS ${SOURCE_DIR}/.deps/git_commit commit LIMIT_COUNT 1)
  else()
    set(commit "unknown")
  endif()
endif()
set(content "#pragma once\n#define HARNESS_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT "${old}" STREQUAL "${content}")
  file(WRITE ${OUTPUT} "${content}")
endif()
