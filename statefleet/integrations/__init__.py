"""Voice-agent framework plug-ins over `statefleet.client.AvatarStream`: `pipecat` (the
`statefleet[pipecat]` extra) and `livekit` (`statefleet[livekit]`). Each imports its framework, so
import the one you use."""
